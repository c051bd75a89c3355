-- lanes.lua: the lanes other than main that a waiter was put in, for the
-- admitter to merge those no longer configured (see admit_tick.lua).
--
-- KEYS: the route's six keys (see route.lua).
-- ARGV: none.
-- Returns: the stats hash's `lanes` field (`,name,name,`), or ''.
-- Invariant: writes nothing but the epoch of an unseen route.

return redis.call('HGET', stats_key, 'lanes') or ''
