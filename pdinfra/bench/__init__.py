"""SLO benchmarking of aggregated vs prefill/decode-disaggregated serving (``pdinfra bench``).

- :mod:`pdinfra.bench.plan`: the sweep (points, seeds) and the SLO;
- :mod:`pdinfra.bench.runner`: the ``vllm bench serve`` command per point and the run directory;
- :mod:`pdinfra.bench.analysis`: percentiles, goodput, SLO attainment, the recommendation;
- :mod:`pdinfra.bench.report`: plots, HTML and Markdown reports, comparisons of runs.
"""

from __future__ import annotations
