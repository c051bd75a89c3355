-- shares.lua: one sub-line's side of a split route's tick (`shards`,
-- src/queue/shards.rs): the coordinator looks at every sub-line, then moves
-- free capacity between them, each call stamped with its generation.
--
-- KEYS: the sub-line's six keys and its lanes' (see route.lua).
-- ARGV: [1] 'look' | 'give' | 'add' | 'peek'  [2] the coordinator's
--       generation (peek: unused)
--   look: [3] heads wanted  [4] the route's number of sub-lines
--         [5] tick (ms)  [6] max_admit_per_tick (of the sub-line's window)
--         [7] the sub-line's epoch the caller saw last (µs), or ''
--         [8] pass_ttl (ms): the hold when [7] shows a lost store
--   give: [3] capacity wanted back   add: [3] capacity given
--   peek: [3], [4] as look's [7], [8], [5] as look's [4] (an instance not
--         coordinating)
-- Returns:
--   look: {1, has a share (1|0), share, active, held (1|0), epoch µs,
--          now µs, admissions in this tick window, waiting (every lane),
--          the join scores of the first heads-wanted waiters of every lane
--          together, ascending...}
--         {0} a later generation looked already: this coordinator is stale
--         {2, n} the store holds the route in n sub-lines, not ARGV[4],
--         and this sub-line holds waiters or sessions
--   give: {1, given}   add: {1, share after}   {0, 0}: stale generation
--   peek: {1, epoch µs, now µs, waiting in each lane...}, or {2, n} as look
-- Invariant: a look stamps the generation, and give and add are refused
-- unless the stamp is still theirs, so a coordinator that stalled past its
-- lease moves nothing once a later one has looked. Give never takes a share
-- below the sub-line's active count: only free capacity moves, so no
-- sub-line ever holds more live sessions than its share and the shares
-- never sum over the route's capacity (src/queue/shards.rs has the proof).

local op = ARGV[1]
local gen = tonumber(ARGV[2])

-- The sub-line's epoch changed since the caller last saw it: it was lost,
-- and a hold starts, as admit_tick.lua does on an unsplit route.
local function notice(known, pass_ttl)
  local known_epoch_us = tonumber(known)
  if known_epoch_us and known_epoch_us ~= epoch_us then
    notice_loss(tonumber(pass_ttl))
  end
end

-- The split this sub-line was last looked at as, if other than `shards`
-- while it holds waiters or sessions (an empty one takes the new split).
local function other_split(shards)
  local recorded = tonumber(redis.call('HGET', stats_key, 'shards'))
  if recorded and recorded ~= shards
      and (waiting_total() > 0 or active_count() > 0) then
    return recorded
  end
  return nil
end

if op == 'peek' then
  local other = other_split(tonumber(ARGV[5]))
  if other then
    return {2, other}
  end
  notice(ARGV[3], ARGV[4])
  local reply = {1, epoch_us, now_us}
  for l = 1, #lane_keys do
    reply[#reply + 1] = redis.call('ZCARD', lane_keys[l])
  end
  return reply
end

local stamped = tonumber(redis.call('HGET', stats_key, 'share_gen')) or 0

if op == 'look' then
  if stamped > gen then
    return {0}
  end
  local wanted = tonumber(ARGV[3])
  local shards = tonumber(ARGV[4])
  -- A sub-line records the split it belongs to (an unsplit route's tick
  -- records a split of one: admit_tick.lua).
  local other = other_split(shards)
  if other then
    return {2, other}
  end
  redis.call('HSET', stats_key, 'share_gen', int(gen), 'shards', int(shards))
  notice(ARGV[7], ARGV[8])
  local _, used = tick_window(tonumber(ARGV[5]), tonumber(ARGV[6]))
  local held = 0
  if hold_until() > now_us then
    held = 1
  end
  local share = redis.call('HGET', stats_key, 'share')
  local reply = {1, share and 1 or 0, tonumber(share) or 0, active_count(), held,
    epoch_us, now_us, used, waiting_total()}
  local heads = {}
  for l = 1, #lane_keys do
    local found = redis.call('ZRANGE', lane_keys[l], 0, wanted - 1, 'WITHSCORES')
    for i = 2, #found, 2 do
      heads[#heads + 1] = tonumber(found[i])
    end
  end
  table.sort(heads)
  for i = 1, math.min(wanted, #heads) do
    reply[#reply + 1] = heads[i]
  end
  return reply
end

if stamped ~= gen then
  return {0, 0}
end
local amount = tonumber(ARGV[3])
if op == 'give' then
  local share = tonumber(redis.call('HGET', stats_key, 'share')) or 0
  local given = math.max(0, math.min(amount, share - active_count()))
  redis.call('HSET', stats_key, 'share', int(share - given))
  return {1, given}
end
return {1, redis.call('HINCRBY', stats_key, 'share', amount)}
