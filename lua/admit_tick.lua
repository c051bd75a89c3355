-- admit_tick.lua: one admitter tick of one instance.
--
-- KEYS: the route's six keys, its configured lanes' (see route.lua), then
--       the keys of lanes no longer configured that may hold waiters (the
--       names the stats hash's `lanes` field lists, read before).
-- ARGV: [1] capacity ('': the sub-line's share, see route.lua)
--       [2] max_admit_per_tick  [3] tick (ms)
--       [4] arrival_grace (ms)  [5] abandon_after (ms)  [6] pass_ttl (ms)
--       [7] the epoch this instance saw last (µs), or '' if none
--       [8] n, the number of configured lanes, then [9 .. 8 + n] their
--       weights, in order
--       [9 + n] when the route opens (µs), or '' if it has no opening
--       [10 + n] a seed (hex of 32 random bytes from the caller's OS
--       CSPRNG, never stored) that orders the pre-queue at the opening
--       [11 + n] on a sub-line of a split route: '1' if it may admit
--       arrivals at once until the next tick (nobody waited anywhere), '0'
--       if not (kept in the stats hash's `open`); '' on an unsplit route
-- Returns: {ran (1|0), now µs, epoch µs, abandoned, no_shows,
--           unconfirmed sessions freed, unconfirmed tickets dropped,
--           unmerged (1: `lanes` names a lane neither configured nor given,
--           left for a later tick), opening (0: none this tick; 1 + the
--           number of waiters it shuffled), n, admitted from each lane (n
--           numbers), waiting in each lane after the tick (n numbers), the
--           lowest join score left in each lane (n numbers, 0: empty), then
--           for each waiter admitted, in admission order, its join score and
--           its lane (1-based)...}
--          (a tick that did not run: the first seven, then 0, 0, 0)
-- Errors: SPLIT when the route's line is split into sub-lines (`shards`)
-- and this slot is not empty.
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
-- Lanes: the waiters of every lane given but not configured are moved into
-- the first lane at their scores before anyone is admitted; admission is
-- FIFO within a lane and shared between the lanes with waiters by smooth
-- weighted round robin (nginx's: each pick, every eligible lane's current
-- grows by its weight, the largest, first on a tie, is picked and loses the
-- eligible weights' sum), `current` kept in wrr:NAME so the split holds
-- across ticks and instances. A pick whose lane turns out to hold only
-- ghosts is undone, so the sequence is the one the line without them gives.
-- Opening (DESIGN §8.7): before the opening nobody is admitted; the first
-- tick at or after it shuffles the pre-queue (every waiter whose score is
-- before the opening, in each lane) once, and notes the opening it ran for
-- in the stats hash's `opened`, so no later tick, on any instance, runs it
-- again. The order is that of sha1(seed .. member): unpredictable without
-- the seed, which only this call sees. The shuffled waiters take the scores
-- just before the opening, one block per lane, so every later arrival
-- (scored at or after the opening) stays behind them. A store created or
-- wiped after the opening held no pre-queue: its opening shuffles nothing,
-- so waiters restored at their scores keep them.

local capacity = capacity_of(ARGV[1])
local max_admit_per_tick = tonumber(ARGV[2])
local tick_ms = tonumber(ARGV[3])
local arrival_grace_ms = tonumber(ARGV[4])
local abandon_after_ms = tonumber(ARGV[5])
local pass_ttl_ms = tonumber(ARGV[6])
local known_epoch_us = tonumber(ARGV[7])
local configured = tonumber(ARGV[8]) or 1
local weights = {}
for l = 1, configured do
  weights[l] = tonumber(ARGV[8 + l]) or 1
end
local opens_at_us = tonumber(ARGV[9 + configured])
local seed = ARGV[10 + configured] or ''
local open = ARGV[11 + configured] or ''
if open ~= '' then
  redis.call('HSET', stats_key, 'open', open)
end
-- record::HEAD: places answered by the store, never estimated.
local RECORD_HEAD = 100

-- A route ticked as one line records it; one whose line the store holds
-- split into sub-lines (shares.lua) is refused while this slot holds
-- waiters or sessions, since its visitors are in the sub-lines. (A sub-line's own tick, capacity '', was checked by the
-- coordinator's look.)
if ARGV[1] ~= '' then
  local split = tonumber(redis.call('HGET', stats_key, 'shards'))
  if split and split ~= 1 and (waiting_total() > 0 or active_count() > 0) then
    return redis.error_reply('SPLIT the store holds this route split in '
      .. int(split) .. ' sub-lines')
  end
  if split ~= 1 then
    redis.call('HSET', stats_key, 'shards', 1)
  end
end

-- The epoch this instance remembered changed: the store was lost.
if known_epoch_us and known_epoch_us ~= epoch_us then
  notice_loss(pass_ttl_ms)
end

local window = math.floor(now_ms / tick_ms)
if redis.call('GET', tick_key) == int(window) then
  return {0, now_us, epoch_us, 0, 0, 0, 0, 0, 0, 0}
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

-- Lanes no longer configured: their waiters join the first lane at their
-- scores, their round-robin state goes. `lanes` keeps the names configured
-- and any it listed that this call could not merge (no key given).
local first_key = lane_keys[1]
local merged = {}
for l = configured + 1, #lane_keys do
  merged[lane_names[l]] = true
  if lane_keys[l] ~= first_key then
    while true do
      local batch = redis.call('ZPOPMIN', lane_keys[l], 1000)
      if #batch == 0 then
        break
      end
      local args = {}
      for i = 1, #batch, 2 do
        args[#args + 1] = batch[i + 1]
        args[#args + 1] = batch[i]
      end
      redis.call('ZADD', first_key, unpack(args))
    end
  end
  redis.call('HDEL', stats_key, 'wrr:' .. lane_names[l], 'admitted:' .. lane_names[l])
end
local is_configured = {}
local lanes_field = ','
for l = 1, configured do
  is_configured[lane_names[l]] = true
  if lane_names[l] ~= 'main' then
    lanes_field = lanes_field .. lane_names[l] .. ','
  end
end
local unmerged = 0
local used = redis.call('HGET', stats_key, 'lanes') or ','
for name in string.gmatch(used, '[^,]+') do
  if not is_configured[name] and not merged[name] then
    unmerged = 1
    lanes_field = lanes_field .. name .. ','
  end
end
redis.call('HSET', stats_key, 'lanes', lanes_field)
-- From here on, the configured lanes only.
for l = #lane_keys, configured + 1, -1 do
  lane_keys[l], lane_names[l] = nil, nil
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
local scan = math.ceil(waiting_total() * tick_ms / abandon_after_ms)
local ghosts, unconfirmed_tickets = drop_ghosts(abandon_after_ms,
  math.min(20000, math.max(1000, scan)))
local pending = redis.call('HMGET', stats_key, 'pending_abandoned',
  'pending_unconfirmed_tickets')
local abandoned = ghosts + (tonumber(pending[1]) or 0)
unconfirmed_tickets = unconfirmed_tickets + (tonumber(pending[2]) or 0)
redis.call('HDEL', stats_key, 'pending_abandoned', 'pending_unconfirmed_tickets')

-- The opening: the pre-queue of every configured lane shuffled, once.
local before_opening = opens_at_us ~= nil and now_us < opens_at_us
local opening = 0
if opens_at_us and not before_opening
    and redis.call('HGET', stats_key, 'opened') ~= int(opens_at_us) then
  local shuffled = 0
  if epoch_us < opens_at_us then
    local early = {}
    for l = 1, configured do
      early[l] = redis.call('ZRANGEBYSCORE', lane_keys[l], '-inf',
        '(' .. int(opens_at_us))
      shuffled = shuffled + #early[l]
    end
    local next_score = opens_at_us - shuffled
    for l = 1, configured do
      -- Each member keyed by its hash, so a plain string sort orders them;
      -- the member is what follows the 40 hex digits.
      local keyed = {}
      for i, id in ipairs(early[l]) do
        keyed[i] = redis.sha1hex(seed .. id) .. id
      end
      table.sort(keyed)
      local args = {}
      for i = 1, #keyed do
        args[#args + 1] = int(next_score)
        args[#args + 1] = string.sub(keyed[i], 41)
        next_score = next_score + 1
        if #args >= 2000 then
          redis.call('ZADD', lane_keys[l], unpack(args))
          args = {}
        end
      end
      if #args > 0 then
        redis.call('ZADD', lane_keys[l], unpack(args))
      end
    end
  end
  redis.call('HSET', stats_key, 'opened', int(opens_at_us))
  opening = 1 + shuffled
end

local scores = {}
local admitted_lanes = {}
local lane_admitted = {}
for l = 1, configured do
  lane_admitted[l] = 0
end
if now_us >= hold_until() and not before_opening then
  local window_now, used_now, room = tick_window(tick_ms, max_admit_per_tick)
  local want = math.min(capacity - active_count(), room)
  local admitted = 0
  local pops = 0
  local pending_expiry = int(now_ms + arrival_grace_ms) .. '.5'
  local counts, current = {}, {}
  for l = 1, configured do
    counts[l] = redis.call('ZCARD', lane_keys[l])
    current[l] = tonumber(redis.call('HGET', stats_key, 'wrr:' .. lane_names[l])) or 0
  end
  while admitted < want and pops < want + 1000 do
    -- The next lane by smooth weighted round robin among those with waiters.
    local total, best, eligible = 0, nil, {}
    for l = 1, configured do
      if counts[l] > 0 then
        eligible[#eligible + 1] = l
        total = total + weights[l]
        current[l] = current[l] + weights[l]
        if not best or current[l] > current[best] then
          best = l
        end
      end
    end
    if not best then
      break
    end
    current[best] = current[best] - total
    local found = false
    while not found and counts[best] > 0 and pops < want + 1000 do
      local head = redis.call('ZPOPMIN', lane_keys[best])
      if #head == 0 then
        counts[best] = 0
        break
      end
      pops = pops + 1
      counts[best] = counts[best] - 1
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
        lane_admitted[best] = lane_admitted[best] + 1
        scores[#scores + 1] = tonumber(head[2])
        admitted_lanes[#admitted_lanes + 1] = best
        found = true
      end
    end
    if not found then
      -- Only ghosts there: as if the lane had had no waiters.
      current[best] = current[best] + total
      for _, l in ipairs(eligible) do
        current[l] = current[l] - weights[l]
      end
    end
  end
  for l = 1, configured do
    redis.call('HSET', stats_key, 'wrr:' .. lane_names[l], int(current[l]))
    if lane_admitted[l] > 0 then
      redis.call('HINCRBY', stats_key, 'admitted:' .. lane_names[l], lane_admitted[l])
    end
  end
  if admitted > 0 then
    record_admissions(window_now, used_now, admitted)
  end
end
local reply = {1, now_us, epoch_us, abandoned, no_shows, unconfirmed_sessions,
  unconfirmed_tickets, unmerged, opening, configured}
for l = 1, configured do
  reply[#reply + 1] = lane_admitted[l]
end
local lane_waiting = {}
for l = 1, configured do
  lane_waiting[l] = redis.call('ZCARD', lane_keys[l])
  reply[#reply + 1] = lane_waiting[l]
end
for l = 1, configured do
  local head = redis.call('ZRANGE', lane_keys[l], 0, 0, 'WITHSCORES')
  reply[#reply + 1] = head[2] and tonumber(head[2]) or 0
end
for i = 1, #scores do
  reply[#reply + 1] = scores[i]
  reply[#reply + 1] = admitted_lanes[i]
end

-- The line record (src/queue/record.rs has the rule and the wire format):
-- the join scores at the sampled ranks, so that every instance answers the
-- polls from behind the head of the line without a call each until the next
-- tick. About 500 ranks for a million waiting, each an O(log n) lookup;
-- per lane, ranks within the lane.
local record = {int(epoch_us)}
for l = 1, configured do
  local waiting = lane_waiting[l]
  local lane = {lane_names[l], int(waiting)}
  local rank = RECORD_HEAD
  while waiting >= RECORD_HEAD do
    local r = math.min(rank, waiting)
    local at = redis.call('ZRANGE', lane_keys[l], r - 1, r - 1, 'WITHSCORES')
    lane[#lane + 1] = int(r)
    lane[#lane + 1] = int(tonumber(at[2]))
    if r == waiting then
      break
    end
    rank = rank + math.max(1, math.floor(rank / 50))
  end
  record[#record + 1] = table.concat(lane, ',')
end
redis.call('HSET', stats_key, 'record', table.concat(record, ';'))
return reply
