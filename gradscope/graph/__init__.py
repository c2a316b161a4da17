"""Graph: an autograd graph walked into plain data, and what users do with that data.

Capture (touches torch; never rich or graphviz):
    walk          ``gs.trace``: the iterative walk over ``grad_fn.next_functions`` (``_cwalk.c``
                  is its optional C part, ``_cwalk.pyi`` its stub)
    tensor_facts  what the walk reads of one tensor (shape, nested/jagged, view base)
    nest          the tensors in whatever a model returned (tuples, dicts, dataclasses, ...)
    scopes        ``gs.scopes``: which module's forward created each autograd node
    compiled      reading a ``torch.compile`` region (its aten graph and names)
    regions       compiled regions in a traced graph, as clusters of aten ops
    release       ``gs.release``: free deep graphs without a deep C stack

Plain data (no torch, rich or graphviz):
    nodes         ``Node``, ``Edge``, ``SavedTensor``, ``TensorInfo``, ``Box``, ``Region``
    graph         ``Graph`` and the methods users call on it
    schema        reading (and validating) a graph's JSON document
    schema_write  writing a graph's JSON document, and the schema's tables
    paths         module paths and the helpers every feature shares
    transforms    collapse to a depth, fold, ``readable_view``
    folding       runs of identical sibling modules found and folded
    regroup       groups of nodes replaced by one box
    diff          ``gs.diff``: what changed between two graphs
    gcpause       the collector paused while a block builds many objects
"""
