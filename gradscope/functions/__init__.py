"""Functions: custom ``autograd.Function``s checked, and what a tensor is made of.

Modules:
    check            ``gs.check``: gradcheck and gradgradcheck with a readable result (capture)
    check_records    ``CheckResult``, ``CheckFailure`` (plain data)
    check_views      the rich rendering of a ``CheckResult``
    explain          ``gs.explain``: a tensor's storage, strides and offset, measured (capture)
    explain_records  ``Explanation`` (plain data)
    explain_views    the index -> storage table and picture
"""
