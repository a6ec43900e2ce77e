"""What a storage backend can and cannot do, as one value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a backend can and cannot do: the one value code outside ``storage/`` asks, instead
    of which database it is.

    - ``one_writer``: every write goes through one serialised connection (SQLite); there are no
      row locks, so nothing waits for another transaction's lock.
    - ``listens``: writes made by one node reach the others as notifications (PostgreSQL's
      ``LISTEN/NOTIFY``); without it only one node uses the database.
    - ``prompt_results``: a result batch is written as soon as it arrives rather than gathered a
      moment first; worth it where a write does not hold the only writer.
    - ``trim_batch``: how many finished runs one history-trim transaction deletes. Where there is
      one writer a batch holds it while it deletes, and runs due meanwhile wait behind it, so
      batches are small; where rows are locked, a trim locks only the rows it deletes and writers
      of other rows go on.
    - ``write_faults``: the store reports a fault that keeps every write from committing (a full
      disk, a read-only file) as :attr:`SQLStore.write_fault`.
    """

    one_writer: bool
    listens: bool
    prompt_results: bool
    trim_batch: int
    write_faults: bool
