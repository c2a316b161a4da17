"""Numerics: where two runs of the same step diverge (precision, compile, parallelism, versions).

Modules:
    sketch     the fixed-seed linear sketch of a tensor and its statistics (capture)
    record     ``gs.record_numerics``: the dispatch mode that summarises every op of a forward
               and backward, and each parameter's gradient (capture)
    records    ``NumericsRun`` and its ``OpRecord`` / ``LeafRecord`` / ``ParamRecord`` /
               ``Stats``; ``Divergence`` with its ``DivergencePoint`` and ``ParamDiff``
               (plain data)
    compare    ``gs.compare_runs``: matching two runs' ops and naming the first error its
               inputs do not explain (plain data)
    views      the rich rendering of a ``Divergence``
    page       ``gs.trace_divergence``: a ``Divergence`` on the candidate's autograd graph, each
               node with the error of the ops it ran, for the graph page (capture)
"""
