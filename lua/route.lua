-- route.lua: the prelude every store script (except ready.lua) starts with;
-- it is prepended at build time, so each script stays one atomic EVALSHA.
--
-- KEYS (the same six, in this order, for every script; one `{route}` hash
-- tag, so they share a Cluster slot):
--   KEYS[1] qg:{route}:waiting  ZSET  id -> join score (store time, µs): the
--                                      line of the lane `main` (a route
--                                      without lanes has only that one)
--   KEYS[2] qg:{route}:seen     ZSET  id -> -time (ms) of a tombstone: a
--                                      purged no-show (its expiry) or a leave
--                                      (its time), kept abandon_after (only
--                                      tombstones: the last polls are in beat)
--   KEYS[3] qg:{route}:active   ZSET  id -> expiry (ms); an expiry ending in
--                                      .5 marks a waiter admitted from the
--                                      line who has not shown up yet, one
--                                      ending in .25 a session admitted at
--                                      once and not yet confirmed
--   KEYS[4] qg:{route}:tick     string: the tick window last admitted in
--                                      (SET PX tick, expires by itself)
--   KEYS[5] qg:{route}:stats    HASH  epoch (µs), admitted_total,
--                                      rate_n / rate_t / rate_at / last_admit
--                                      (decayed admit count, decayed elapsed s,
--                                      µs of update, µs of last admission),
--                                      hold_until (µs), loss_noticed (a hold
--                                      was started in this epoch), window /
--                                      used (tick window, admissions in it),
--                                      last_score (µs, keeps join scores
--                                      unique), pending_abandoned (ghosts
--                                      dropped since the last tick),
--                                      pending_unconfirmed_tickets (tickets
--                                      never polled, dropped since then),
--                                      last_tick (ms of the last tick run,
--                                      for noticing a gap), beat_cursor (where
--                                      the ghost scan of beat goes on), record
--                                      (the line record, admit_tick.lua),
--                                      lanes (`,name,name,`: the lanes other
--                                      than main a waiter was put in, for
--                                      merging those no longer configured),
--                                      wrr:NAME / admitted:NAME (a lane's
--                                      weighted round-robin `current` and its
--                                      admissions from the line); on a
--                                      sub-line of a split route, share /
--                                      share_gen / shards (shares.lua) and
--                                      open (admit_tick.lua); on sub-line 0,
--                                      coord_window / coord_gen (coord.lua)
--   KEYS[6] qg:{route}:beat     HASH  id -> last poll of an id in line, ms
--                                      after the epoch in decimal (a hash
--                                      entry costs about half a sorted-set
--                                      one); prefixed `u` for a ticket never
--                                      polled (unconfirmed), set back
--                                      abandon_after - confirm_within so the
--                                      ghost rule drops it confirm_within
--                                      after joining
-- then the waiting keys of the route's lanes, in its configured order (the
-- first is where newcomers go): `qg:{route}:waiting` for the lane `main`,
-- `qg:{route}:waiting:lane:NAME` (ZSET, as waiting) for any other; the
-- prelude takes KEYS[7] on as lanes for as long as they are such keys (none
-- given: the one lane `main`), and admit_tick.lua then lanes no longer
-- configured; `extra` is the index of the last of them. After them,
-- and, for arrive, poll and renew from a client the limits count:
--   KEYS[extra + 1] qg:{route}:client:<hex client key>  ZSET  id -> join time (ms)
--                                      of each visitor the client brought in
--                                      (joined or admitted at once), kept
--                                      while it may hold a place or falls in
--                                      the join window; the key expires
--                                      client memory after its last contact
-- and, for count_request:
--   KEYS[extra + 1] qg:{route}:uses:<hex id>  string: forwarded requests of one
--                                      session, on routes with
--                                      max_requests_per_session; expires
--                                      session_ttl + pass_ttl after the last
-- Ids are the raw first 12 bytes of the visitor ids (`store_id` in
-- src/queue/mod.rs): members only, never part of a key.
--
-- It defines: now_us / now_ms (Redis TIME), epoch_us (created with HSETNX by
-- the first script that touches the route), and the helpers below.
-- Invariant: every integer written is formatted with %d, so scores and
-- fields never turn into exponent notation.

local waiting_key, seen_key, active_key, tick_key, stats_key, beat_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

-- The lanes' keys and names (see above).
local lane_prefix = waiting_key .. ':lane:'
local lane_keys, lane_names = {}, {}
local extra = 6
while KEYS[extra + 1] and (KEYS[extra + 1] == waiting_key
    or string.sub(KEYS[extra + 1], 1, #lane_prefix) == lane_prefix) do
  extra = extra + 1
  lane_keys[#lane_keys + 1] = KEYS[extra]
  if KEYS[extra] == waiting_key then
    lane_names[#lane_names + 1] = 'main'
  else
    lane_names[#lane_names + 1] = string.sub(KEYS[extra], #lane_prefix + 1)
  end
end
if #lane_keys == 0 then
  lane_keys, lane_names = {waiting_key}, {'main'}
end
local client_key = KEYS[extra + 1]

local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now_ms = math.floor(now_us / 1000)

local function int(x)
  return string.format('%d', x)
end

redis.call('HSETNX', stats_key, 'epoch', int(now_us))
local epoch_us = tonumber(redis.call('HGET', stats_key, 'epoch'))

-- The admit rate, the same formula as the memory store: on each admission at
-- t, with w = exp(-(t - rate_at) / tau),
--   rate_n = rate_n * w + admitted,  rate_t = rate_t * w + tau * (1 - w)
-- (rate_t starts at 0 at the epoch, so a young route reports count / age);
-- rate = rate_n / max(rate_t, 1 s) decayed to now, or 0 when nothing was
-- admitted for 5 tau.
local RATE_TAU_S = 60
local RATE_QUIET_US = 5 * RATE_TAU_S * 1000000

-- A route split into sub-lines (`shards`, see shares.lua) gives each its
-- share of the capacity, kept in the sub-line's stats hash as `share`; its
-- callers pass the capacity as '' and the share counts instead (none yet,
-- or lost with the store: 0, so nobody is admitted on a share not given).
local function capacity_of(arg)
  if arg == '' then
    return tonumber(redis.call('HGET', stats_key, 'share')) or 0
  end
  return tonumber(arg)
end

-- The hold: nobody new is admitted before hold_until.
local function hold_until()
  return tonumber(redis.call('HGET', stats_key, 'hold_until')) or 0
end

-- A store loss was noticed: the first notice in this epoch holds admissions
-- for one pass_ttl; later ones do not extend it, so returning visitors cannot
-- keep the line stopped.
local function notice_loss(pass_ttl_ms)
  if redis.call('HSETNX', stats_key, 'loss_noticed', 1) == 1 then
    redis.call('HSET', stats_key, 'hold_until', int(now_us + pass_ttl_ms * 1000))
  end
end

-- The tick window now, admissions already made in it, and the room left.
local function tick_window(tick_ms, max_admit_per_tick)
  local window = math.floor(now_ms / tick_ms)
  local kept = redis.call('HMGET', stats_key, 'window', 'used')
  local used = 0
  if tonumber(kept[1]) == window then
    used = tonumber(kept[2]) or 0
  end
  local room = max_admit_per_tick - used
  if room < 0 then
    room = 0
  end
  return window, used, room
end

-- Decayed admission count and decayed elapsed seconds, brought up to now.
local function admit_rate_state()
  local kept = redis.call('HMGET', stats_key, 'rate_n', 'rate_t', 'rate_at')
  local n = tonumber(kept[1]) or 0
  local t = tonumber(kept[2]) or 0
  local at = tonumber(kept[3]) or epoch_us
  local dt = (now_us - at) / 1000000
  if dt < 0 then
    dt = 0
  end
  local decay = math.exp(-dt / RATE_TAU_S)
  return n * decay, t * decay + RATE_TAU_S * (1 - decay)
end

-- Records `count` admissions made now in `window` (which had `used` already).
local function record_admissions(window, used, count)
  local n, t = admit_rate_state()
  local at = tonumber(redis.call('HGET', stats_key, 'rate_at')) or epoch_us
  if now_us > at then
    at = now_us
  end
  redis.call('HSET', stats_key,
    'window', int(window), 'used', int(used + count),
    'rate_n', string.format('%.17g', n + count),
    'rate_t', string.format('%.17g', t),
    'rate_at', int(at),
    'last_admit', int(now_us))
  redis.call('HINCRBY', stats_key, 'admitted_total', count)
end

-- Admissions per second now (see RATE_TAU_S).
local function admit_rate()
  local last = tonumber(redis.call('HGET', stats_key, 'last_admit'))
  if not last or now_us - last > RATE_QUIET_US then
    return 0
  end
  local n, t = admit_rate_state()
  if t < 1 then
    t = 1
  end
  return n / t
end

-- Whether an active score carries a fraction: an admitted waiter still
-- arriving (.5) or an unconfirmed session (.25).
local function marked(score, fraction)
  return score % 1 == fraction
end

-- A waiter's last poll (ms) as kept in beat, and whether it never polled.
local epoch_ms = math.floor(epoch_us / 1000)
local function beat_value(ms, unconfirmed)
  return (unconfirmed and 'u' or '') .. int(ms - epoch_ms)
end
local function parse_beat(value)
  local unconfirmed = string.sub(value, 1, 1) == 'u'
  local after = tonumber(unconfirmed and string.sub(value, 2) or value) or 0
  return epoch_ms + after, unconfirmed
end

-- `id` (in line) polled now: confirmed, alive.
local function beat_now(id)
  redis.call('HSET', beat_key, id, beat_value(now_ms, false))
end

-- The lane holding `id` (its index in lane_keys) and its join score, or nil.
local function find_lane(id)
  for l = 1, #lane_keys do
    local score = tonumber(redis.call('ZSCORE', lane_keys[l], id))
    if score then
      return l, score
    end
  end
  return nil
end

-- Takes `id` out of every lane; returns 1 if it was in line, else 0.
local function remove_from_line(id)
  local removed = 0
  for l = 1, #lane_keys do
    removed = removed + redis.call('ZREM', lane_keys[l], id)
  end
  return math.min(removed, 1)
end

-- Waiters in every lane given.
local function waiting_total()
  local total = 0
  for l = 1, #lane_keys do
    total = total + redis.call('ZCARD', lane_keys[l])
  end
  return total
end

-- Puts `id` in lane `lane` at `score`, remembering in the stats hash's
-- `lanes` that the lane (other than main) holds waiters, so that it is
-- merged once no longer configured (see admit_tick.lua).
local function put_in_lane(lane, score, id)
  redis.call('ZADD', lane_keys[lane], int(score), id)
  local name = lane_names[lane]
  if name ~= 'main' then
    local used = redis.call('HGET', stats_key, 'lanes') or ','
    if not string.find(used, ',' .. name .. ',', 1, true) then
      redis.call('HSET', stats_key, 'lanes', used .. name .. ',')
    end
  end
end

-- Drops the ghosts (last poll before now - abandon_after, unconfirmed
-- tickets included: their time is set back) among the next `budget` or so
-- waiters of a scan of beat that goes on where the last call left it (one
-- call sees every waiter of a small line; a long line is covered every
-- waiting / budget calls); returns how many ghosts and how many unconfirmed
-- tickets. A ghost met at the head of the line is never admitted whatever
-- the scan (see admit_tick.lua); the scan keeps counts and positions true.
local function drop_ghosts(abandon_after_ms, budget)
  local cursor = redis.call('HGET', stats_key, 'beat_cursor') or '0'
  local scanned = redis.call('HSCAN', beat_key, cursor, 'COUNT', budget)
  redis.call('HSET', stats_key, 'beat_cursor', scanned[1])
  local entries = scanned[2]
  local cutoff = now_ms - abandon_after_ms
  local ids, unconfirmed = {}, 0
  for i = 1, #entries, 2 do
    local ms, never_polled = parse_beat(entries[i + 1])
    if ms < cutoff then
      ids[#ids + 1] = entries[i]
      if never_polled then
        unconfirmed = unconfirmed + 1
      end
    end
  end
  for i = 1, #ids, 1000 do
    local last = math.min(i + 999, #ids)
    for l = 1, #lane_keys do
      redis.call('ZREM', lane_keys[l], unpack(ids, i, last))
    end
    redis.call('HDEL', beat_key, unpack(ids, i, last))
  end
  return #ids - unconfirmed, unconfirmed
end

-- Whether an id in line was never polled.
local function unconfirmed_ticket(id)
  local value = redis.call('HGET', beat_key, id)
  return value ~= false and string.sub(value, 1, 1) == 'u'
end

-- Whether a waiter's last poll makes it a ghost (no poll recorded: not one,
-- so a lost heartbeat never costs a place).
local function is_ghost(id, abandon_after_ms)
  local value = redis.call('HGET', beat_key, id)
  if not value then
    return false
  end
  local ms = parse_beat(value)
  return ms < now_ms - abandon_after_ms
end

-- A no-show, admitted at `expiry_ms` - arrival_grace, was purged: a tombstone
-- in `seen` tells its ticket from a lost write (see poll.lua). An id that
-- joined the line again keeps its place and gets none; NX keeps an earlier
-- tombstone.
local function bury_no_show(id, expiry_ms)
  if redis.call('HEXISTS', beat_key, id) == 0 then
    redis.call('ZADD', seen_key, 'NX', int(-math.floor(expiry_ms)), id)
  end
end

-- Whether `id` left or was admitted and never came: a tombstone, or a pending
-- expiry (ending in .5) that ran out and awaits the tick's purge.
local function tombstoned(id)
  local seen = tonumber(redis.call('ZSCORE', seen_key, id))
  if seen ~= nil and seen < 0 then
    return true
  end
  local expiry = tonumber(redis.call('ZSCORE', active_key, id))
  return expiry ~= nil and expiry <= now_ms and marked(expiry, 0.5)
end

-- Ends `id`'s place: out of the line and the active set, with a tombstone
-- (-now ms) in seen so neither its ticket nor its pass is restored as a lost
-- write. Returns how many of the two held it.
local function end_place(id)
  local removed = remove_from_line(id)
  removed = removed + redis.call('ZREM', active_key, id)
  redis.call('HDEL', beat_key, id)
  redis.call('ZADD', seen_key, int(-now_ms), id)
  return removed
end

-- Forgets tombstones buried before now - abandon_after: by then every ticket
-- they could meet is too old for the lost-write rule.
local function forget_tombstones(abandon_after_ms)
  redis.call('ZREMRANGEBYSCORE', seen_key,
    '(' .. int(abandon_after_ms - now_ms), '(0')
  -- Poll times an earlier version kept here: beat holds them now.
  redis.call('ZREMRANGEBYSCORE', seen_key, 0, '+inf')
end

-- The reply for a visitor in lane `lane`: {2, join score, position in the
-- lane, waiting in the lane, lane index (0-based)}.
local function place(id, score, lane)
  local rank = redis.call('ZRANK', lane_keys[lane], id)
  return {2, score, rank + 1, redis.call('ZCARD', lane_keys[lane]), lane - 1}
end

-- Whether `id` holds a live slot (expiry in the future).
local function is_active(id)
  local expiry = tonumber(redis.call('ZSCORE', active_key, id))
  return expiry ~= nil and expiry > now_ms
end

local function active_count()
  return redis.call('ZCOUNT', active_key, '(' .. int(now_ms), '+inf')
end

-- Per-client limits. The places a client holds are counted from the line and
-- the active set themselves (each id it brought in that is still in line and
-- no ghost, or holds a live slot), never kept as a counter, so the count
-- cannot drift when a place is given up in any way.
-- Whether `id` still holds a place.
local function holds_place(id, abandon_after_ms)
  if find_lane(id) then
    return not is_ghost(id, abandon_after_ms)
  end
  return is_active(id)
end

-- Whether the client may bring in one more visitor now: 0 if it may, else the
-- ms to wait (confirm_within for places; until the oldest join leaves the
-- window for joins). Forgets the client's ids that matter no more.
local function client_refusal(places, joins_per_minute, window_ms, confirm_ms,
    abandon_after_ms)
  if not client_key then
    return 0
  end
  local members = redis.call('ZRANGE', client_key, 0, -1, 'WITHSCORES')
  local window_start = now_ms - window_ms
  local held, recent, oldest, gone = 0, 0, nil, {}
  for i = 1, #members, 2 do
    local id, joined = members[i], tonumber(members[i + 1])
    local holding = places > 0 and holds_place(id, abandon_after_ms)
    local in_window = joins_per_minute > 0 and joined > window_start
    if holding then
      held = held + 1
    end
    if in_window then
      recent = recent + 1
      oldest = oldest or joined
    end
    if not holding and not in_window then
      gone[#gone + 1] = id
    end
  end
  for i = 1, #gone, 1000 do
    redis.call('ZREM', client_key, unpack(gone, i, math.min(i + 999, #gone)))
  end
  local refused, wait = false, 0
  if places > 0 and held >= places then
    refused, wait = true, confirm_ms
  end
  if joins_per_minute > 0 and recent >= joins_per_minute then
    refused = true
    wait = math.max(wait, oldest + window_ms - now_ms)
  end
  if refused then
    return math.max(wait, 1)
  end
  return 0
end

-- The client brought `id` in now; it is remembered memory_ms from now.
local function client_record(id, memory_ms)
  if client_key then
    redis.call('ZADD', client_key, int(now_ms), id)
    redis.call('PEXPIRE', client_key, memory_ms)
  end
end

-- `id` still holds its place: if the client brought it in, the client is
-- remembered memory_ms from now.
local function client_touch(id, memory_ms)
  if client_key and redis.call('ZSCORE', client_key, id) then
    redis.call('PEXPIRE', client_key, memory_ms)
  end
end

-- (end of prelude)
