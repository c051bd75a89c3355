-- route.lua: the prelude every store script (except ready.lua) starts with;
-- it is prepended at build time, so each script stays one atomic EVALSHA.
--
-- KEYS (the same five, in this order, for every script; one `{route}` hash
-- tag, so they share a Cluster slot):
--   KEYS[1] qg:{route}:waiting  ZSET  id -> join score (store time, µs)
--   KEYS[2] qg:{route}:seen     ZSET  id -> last poll (ms) of an id in line,
--                                      or -expiry (ms) of a purged no-show
--                                      (a tombstone, negative so no poll
--                                      time is ever one; kept abandon_after)
--   KEYS[3] qg:{route}:active   ZSET  id -> expiry (ms); an expiry ending in
--                                      .5 marks a waiter admitted from the
--                                      line who has not shown up yet
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
--                                      dropped since the last tick)
-- Ids are the raw 16-byte visitor ids: members only, never part of a key.
--
-- It defines: now_us / now_ms (Redis TIME), epoch_us (created with HSETNX by
-- the first script that touches the route), and the helpers below.
-- Invariant: every integer written is formatted with %d, so scores and
-- fields never turn into exponent notation.

local waiting_key, seen_key, active_key, tick_key, stats_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

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

-- Drops up to `limit` waiters whose last poll is before now - abandon_after
-- (the oldest first); returns how many. Tombstones (negative) are not waiters.
local function drop_ghosts(abandon_after_ms, limit)
  local ghosts = redis.call('ZRANGEBYSCORE', seen_key, 0,
    '(' .. int(now_ms - abandon_after_ms), 'LIMIT', 0, limit)
  if #ghosts > 0 then
    redis.call('ZREM', waiting_key, unpack(ghosts))
    redis.call('ZREM', seen_key, unpack(ghosts))
  end
  return #ghosts
end

-- Whether a waiter's last poll makes it a ghost (no poll recorded: not one,
-- so a lost heartbeat never costs a place).
local function is_ghost(id, abandon_after_ms)
  local seen = tonumber(redis.call('ZSCORE', seen_key, id))
  return seen ~= nil and seen >= 0 and seen < now_ms - abandon_after_ms
end

-- A no-show, admitted at `expiry_ms` - arrival_grace, was purged: a tombstone
-- in `seen` tells its ticket from a lost write (see poll.lua). NX: an id that
-- joined the line again keeps its poll time.
local function bury_no_show(id, expiry_ms)
  redis.call('ZADD', seen_key, 'NX', int(-math.floor(expiry_ms)), id)
end

-- Whether `id` was admitted and never came: a tombstone, or a pending expiry
-- (ending in .5) that ran out and awaits the tick's purge.
local function is_no_show(id)
  local seen = tonumber(redis.call('ZSCORE', seen_key, id))
  if seen ~= nil and seen < 0 then
    return true
  end
  local expiry = tonumber(redis.call('ZSCORE', active_key, id))
  return expiry ~= nil and expiry <= now_ms and expiry % 1 ~= 0
end

-- Forgets tombstones of no-shows that expired before now - abandon_after: by
-- then every ticket they could meet is too old for the lost-write rule.
local function forget_no_shows(abandon_after_ms)
  redis.call('ZREMRANGEBYSCORE', seen_key,
    '(' .. int(abandon_after_ms - now_ms), '(0')
end

-- The reply for a visitor in line: {2, join score, position, waiting total}.
local function place(id, score)
  local rank = redis.call('ZRANK', waiting_key, id)
  return {2, score, rank + 1, redis.call('ZCARD', waiting_key)}
end

-- Whether `id` holds a live slot (expiry in the future).
local function is_active(id)
  local expiry = tonumber(redis.call('ZSCORE', active_key, id))
  return expiry ~= nil and expiry > now_ms
end

local function active_count()
  return redis.call('ZCOUNT', active_key, '(' .. int(now_ms), '+inf')
end

-- (end of prelude)
