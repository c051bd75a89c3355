-- admit_tick.lua: one admitter tick of one instance.
--
-- KEYS: the route's six keys (see route.lua).
-- ARGV: [1] capacity  [2] max_admit_per_tick  [3] tick (ms)
--       [4] arrival_grace (ms)  [5] abandon_after (ms)  [6] pass_ttl (ms)
--       [7] the epoch this instance saw last (µs), or '' if none
-- Returns: {ran (1|0), now µs, epoch µs, abandoned, no_shows,
--           unconfirmed sessions freed, unconfirmed tickets dropped,
--           join score of each waiter admitted, in admission order...}
-- Invariant: at most one run per tick window floor(now_ms / tick), whichever
-- instance comes first (the tick key holds the window last run); every
-- no-show purged leaves a tombstone in seen for abandon_after; unconfirmed
-- sessions (.25) and tickets (`u` in beat) are counted apart from no-shows
-- and ghosts; admissions
-- in a window (this and admit-now together) never exceed max_admit_per_tick;
-- the active count (expiry > now) never exceeds capacity; ghosts are dropped
-- before anyone behind them is admitted; nobody is admitted during a hold;
-- after a gap in the ticks, sessions are not purged for time the store did
-- not see; a run leaves the line record in the stats hash's `record` field.

local capacity = tonumber(ARGV[1])
local max_admit_per_tick = tonumber(ARGV[2])
local tick_ms = tonumber(ARGV[3])
local arrival_grace_ms = tonumber(ARGV[4])
local abandon_after_ms = tonumber(ARGV[5])
local pass_ttl_ms = tonumber(ARGV[6])
local known_epoch_us = tonumber(ARGV[7])
-- record::HEAD: places answered by the store, never estimated.
local RECORD_HEAD = 100

-- The epoch this instance remembered changed: the store was lost.
if known_epoch_us and known_epoch_us ~= epoch_us then
  notice_loss(pass_ttl_ms)
end

local window = math.floor(now_ms / tick_ms)
if redis.call('GET', tick_key) == int(window) then
  return {0, now_us, epoch_us, 0, 0, 0, 0}
end
redis.call('SET', tick_key, int(window), 'PX', tick_ms)

-- A gap in the ticks: no admitter reached the store for ten ticks (2 s at
-- least): it was paused, or cut off from every instance, which renewed
-- sessions on their own meanwhile. Time the store did not see does not run
-- sessions out: the live ones are moved on by the length of the gap.
local last_tick_ms = tonumber(redis.call('HGET', stats_key, 'last_tick'))
redis.call('HSET', stats_key, 'last_tick', int(now_ms))
if last_tick_ms and now_ms - last_tick_ms > math.max(10 * tick_ms, 2000) then
  local shift_ms = now_ms - last_tick_ms
  local live = redis.call('ZRANGEBYSCORE', active_key, '(' .. int(last_tick_ms),
    '+inf', 'WITHSCORES', 'LIMIT', 0, 10000)
  for i = 1, #live, 2 do
    -- Two decimals keep the .5 and .25 marks.
    redis.call('ZADD', active_key,
      string.format('%.2f', tonumber(live[i + 1]) + shift_ms), live[i])
  end
end

-- Expired slots; an admitted waiter who never showed up has an expiry
-- ending in .5 and leaves a tombstone, so its ticket is not restored as a
-- lost write; an unconfirmed session ends in .25. Tombstones go once older
-- than abandon_after.
forget_tombstones(abandon_after_ms)
local no_shows, unconfirmed_sessions = 0, 0
local expired = redis.call('ZRANGEBYSCORE', active_key, '-inf', int(now_ms),
  'WITHSCORES', 'LIMIT', 0, 10000)
local expired_ids = {}
for i = 1, #expired, 2 do
  expired_ids[#expired_ids + 1] = expired[i]
  local expiry = tonumber(expired[i + 1])
  if marked(expiry, 0.5) then
    no_shows = no_shows + 1
    bury_no_show(expired[i], expiry)
  elseif marked(expiry, 0.25) then
    unconfirmed_sessions = unconfirmed_sessions + 1
  end
end
for i = 1, #expired_ids, 1000 do
  redis.call('ZREM', active_key, unpack(expired_ids, i, math.min(i + 999, #expired_ids)))
end

-- Ghosts and unconfirmed tickets dropped since the last tick (by arrive) and now.
-- The scan covers the whole line about once per abandon_after.
local scan = math.ceil(redis.call('ZCARD', waiting_key) * tick_ms / abandon_after_ms)
local ghosts, unconfirmed_tickets = drop_ghosts(abandon_after_ms,
  math.min(20000, math.max(1000, scan)))
local pending = redis.call('HMGET', stats_key, 'pending_abandoned',
  'pending_unconfirmed_tickets')
local abandoned = ghosts + (tonumber(pending[1]) or 0)
unconfirmed_tickets = unconfirmed_tickets + (tonumber(pending[2]) or 0)
redis.call('HDEL', stats_key, 'pending_abandoned', 'pending_unconfirmed_tickets')

local reply = {1, now_us, epoch_us, 0, no_shows, unconfirmed_sessions, 0}
if now_us >= hold_until() then
  local window_now, used, room = tick_window(tick_ms, max_admit_per_tick)
  local want = math.min(capacity - active_count(), room)
  local admitted = 0
  local pops = 0
  local pending_expiry = int(now_ms + arrival_grace_ms) .. '.5'
  while admitted < want and pops < want + 1000 do
    local head = redis.call('ZPOPMIN', waiting_key)
    if #head == 0 then
      break
    end
    pops = pops + 1
    local id = head[1]
    local ghost = is_ghost(id, abandon_after_ms)
    local never_polled = unconfirmed_ticket(id)
    redis.call('HDEL', beat_key, id)
    if ghost and never_polled then
      unconfirmed_tickets = unconfirmed_tickets + 1
    elseif ghost then
      abandoned = abandoned + 1
    else
      redis.call('ZADD', active_key, pending_expiry, id)
      admitted = admitted + 1
      reply[#reply + 1] = tonumber(head[2])
    end
  end
  if admitted > 0 then
    record_admissions(window_now, used, admitted)
  end
end
reply[4] = abandoned
reply[7] = unconfirmed_tickets

-- The line record (src/queue/record.rs has the rule and the wire format):
-- the join scores at the sampled ranks, so that every instance answers the
-- polls from behind the head of the line without a call each until the next
-- tick. About 500 ranks for a million waiting, each an O(log n) lookup.
local waiting = redis.call('ZCARD', waiting_key)
local record = {int(epoch_us), int(waiting)}
local rank = RECORD_HEAD
while waiting >= RECORD_HEAD do
  local r = math.min(rank, waiting)
  local at = redis.call('ZRANGE', waiting_key, r - 1, r - 1, 'WITHSCORES')
  record[#record + 1] = int(r)
  record[#record + 1] = int(tonumber(at[2]))
  if r == waiting then
    break
  end
  rank = rank + math.max(1, math.floor(rank / 50))
end
redis.call('HSET', stats_key, 'record', table.concat(record, ','))
return reply
