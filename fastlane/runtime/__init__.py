"""What a node and a worker run on, beside the domain: the corrected clock and step watch
(:mod:`.clock`), the kernel timer (:mod:`.alarm`), supervised loops with back-off
(:mod:`.supervise`), loop-lag and GC-pause probes (:mod:`.stalls`), Prometheus metrics
(:mod:`.metrics`), log set-up (:mod:`.logs`) and small asyncio helpers (:mod:`.aio`). Internal."""
