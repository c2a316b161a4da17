"""Callbacks that attach a ``GradMonitor`` to a training framework's loop.

``gradscope.integrations.transformers.GradscopeCallback`` for the Hugging Face ``Trainer`` and
``gradscope.integrations.lightning.GradscopeCallback`` for Lightning. Each is imported on its
own, so neither framework is needed by ``import gradscope``; ``_options`` checks the monitor
options a callback is given (shared by both).
"""
