-- heartbeats.lua: waiters an instance answered from the line record since
-- its last flush polled; one call for all of them.
--
-- KEYS: the route's six keys and its lanes' (see route.lua), then the keys
--       of the clients the polls came from, each once (any number, all under
--       the route's hash tag).
-- ARGV: [1] client memory (ms), then for each waiter: id (16 raw bytes) and
--       the index of its client's key in KEYS (0 if none), ...
-- Returns: for each waiter in order, 1 if it was in line (any lane), else 0.
-- Invariant: for a waiter in line, exactly what poll.lua does to one: its
-- last poll is now (which confirms the ticket) and its client, if it brought
-- the waiter in, is remembered client memory from now. Nothing else is
-- written: a waiter not in line is answered by poll.lua at its next poll.

local memory_ms = tonumber(ARGV[1])
local ids, clients = {}, {}
for i = 2, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  clients[#clients + 1] = tonumber(ARGV[i + 1])
end

local reply = {}
local touched = {}
for first = 1, #ids, 1000 do
  local last = math.min(first + 999, #ids)
  local found = {}
  for l = 1, #lane_keys do
    local scores = redis.call('ZMSCORE', lane_keys[l], unpack(ids, first, last))
    for i = first, last do
      found[i] = found[i] or scores[i - first + 1] ~= false
    end
  end
  local seen = {}
  for i = first, last do
    local in_line = found[i]
    reply[i] = in_line and 1 or 0
    if in_line then
      seen[#seen + 1] = ids[i]
      seen[#seen + 1] = beat_value(now_ms, false)
      local c = clients[i]
      if c > 0 and not touched[c] and redis.call('ZSCORE', KEYS[extra + c], ids[i]) then
        redis.call('PEXPIRE', KEYS[extra + c], memory_ms)
        touched[c] = true
      end
    end
  end
  if #seen > 0 then
    redis.call('HSET', beat_key, unpack(seen))
  end
end
return reply
