"""The scheduler's concepts as pure values and rules, without I/O.

Models and their bounds (:mod:`.models`, :mod:`.limits`, :mod:`.validation`), when a schedule
fires (:mod:`.schedules`), the states of runs and jobs and the events that move them
(:mod:`.lifecycle`, drawn in ``docs/state-machine.md``), what a policy does with a due occurrence
or a failed attempt (:mod:`.policies`, :mod:`.transitions`, :mod:`.run_results`), and the records
the engine hands a store (:mod:`.records`).
Everything else imports from here; nothing here imports from the rest of fastlane but
:mod:`fastlane.errors`.
"""
