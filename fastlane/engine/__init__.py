"""The running scheduler inside a node: shard leases (:mod:`.shards`), the fast lane that fires
due work from an in-memory window (:mod:`.lane`, writing runs ahead in :mod:`.write_ahead`),
dispatch to workers (:mod:`.dispatch`), routing of other nodes' changes (:mod:`.changes`), and
the user-facing steps both the servicers and change routing take (:mod:`.operations`)."""
