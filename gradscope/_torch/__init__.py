"""Torch internals: the only folder that reads a private torch name.

Modules:
    torchcompat   every read of torch's private internals (saved-tensor handles, version
                  counters, the profiler, hook dicts, dispatch keys), behind feature probes that
                  degrade with a note
    handles       ``HookHandle``: the one handle type of every hook owner (idempotent removal,
                  newest first, on exit and on error)
    dynamo        staying invisible to ``torch.compile``: hooks Dynamo never traces
    stamps        what gradscope writes into live autograd nodes' metadata, and the one walk
                  that follows those stamps
"""
