"""Torch internals: the only folder that reads a private torch name.

Modules:
    torchcompat   every read of torch's private internals (saved-tensor handles, version
                  counters, the profiler, hook dicts, dispatch keys), behind feature probes that
                  degrade with a note
    handles       ``HookHandle``: the one handle type of every hook owner (idempotent removal,
                  newest first, on exit and on error)
    dynamo        staying invisible to ``torch.compile``: hooks Dynamo never traces
    stamps        what gradscope writes into live autograd nodes' metadata, the one walk that
                  follows those stamps, and the user's line in a stack (``user_frame``)
    isolated      running a piece of the user's program in a forked child, where it cannot
                  change the user's process (the replay, the memory tools' steps)
"""
