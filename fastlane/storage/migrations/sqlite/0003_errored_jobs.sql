-- A job whose processing raised is set aside in state 'errored' with the reason (and the id of
-- the traceback in the node's log), instead of stopping the node; `resume` takes it back.
ALTER TABLE jobs ADD COLUMN error text;
