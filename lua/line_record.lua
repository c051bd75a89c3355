-- line_record.lua: the line record the last admitter tick that ran left
-- (see admit_tick.lua and src/queue/record.rs).
--
-- KEYS: the route's six keys and its lanes' (see route.lua).
-- Returns: the record's wire form, or false before the first tick of the
--          epoch (a store wiped since has none).

return redis.call('HGET', stats_key, 'record')
