"""Output: how gradscope writes, shared by every feature (no torch).

Modules:
    files     atomic files (``write_atomic``) and output targets (``output_target``: a path or
              ``-`` for stdout)
    formats   the registry of output formats and record renderers (``gs.FORMATS``), filled by
              the renderers
    envelope  the one envelope of every JSON document (``{"gradscope": N, "kind": ...}``) and
              the one encoding of NaN and Inf (``"nan"``, ``"inf"``, ``"-inf"``)
    plots     the one way a plot is made and written (matplotlib on Agg, an atomic PNG)
    style     torchviz's colours, tensor labels, and the one gradient-norm colour scale
"""
