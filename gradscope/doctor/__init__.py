"""Doctor: autograd's errors and silent failures, explained.

Modules:
    core       ``gs.doctor``: the context manager around a training step (capture)
    recorder   what the doctor records while the forward runs (a torch function mode; capture)
    explain    from what the recorder kept to ``Finding`` records (capture)
    findings   ``Finding`` and ``DoctorReport`` (plain data)
    views      the rich rendering of the findings
"""
