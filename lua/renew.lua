-- renew.lua: a pass holder renews its session, confirming a new one.
--
-- KEYS: the route's six keys and its lanes', then the client's key when
--       the client is known and the places limit is on (see route.lua).
-- ARGV: [1] id (16 raw bytes)  [2] pass issued at (unix ms)
--       [3] pass confirmed (1|0)  [4] session_ttl (ms)  [5] pass_ttl (ms)
--       [6] client memory (ms)  [7] pass granted locally (1|0)
--       [8] capacity ('': the sub-line's share, see route.lua)
--       [9] how long an unconfirmed session lives (ms): confirm_within,
--           at most session_ttl
-- Returns: 1 the session is active and now lives session_ttl from now,
--          0 it is gone (left, revoked, expired): the pass is not renewed.
-- Invariant: a missing session is restored as active only when no tombstone
-- says it left, the store would still hold it now had it kept it (a
-- confirmed pass issued less than session_ttl ago, an unconfirmed one less
-- than confirm_within ago), and either it was issued before the epoch
-- (strictly, in ms), so the store could have held it when it was lost (the
-- first such restore starts a hold of pass_ttl, so returning visitors are
-- counted before anyone new is admitted), or an instance granted or renewed
-- it on its own (confirmed) while the store could not answer. A restore
-- confirms the session. Outside a hold, a restore never takes the active
-- count to capacity or over.

local id = ARGV[1]
local issued_ms = tonumber(ARGV[2])
local confirmed = ARGV[3] == '1'
local session_ttl_ms = tonumber(ARGV[4])
local pass_ttl_ms = tonumber(ARGV[5])
local client_memory_ms = tonumber(ARGV[6])
local granted_locally = ARGV[7] == '1'
local capacity = capacity_of(ARGV[8])
local unconfirmed_ms = tonumber(ARGV[9])

if is_active(id) then
  redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
  client_touch(id, client_memory_ms)
  return 1
end

if tombstoned(id) then
  return 0
end

local life_ms = unconfirmed_ms
if confirmed then
  life_ms = session_ttl_ms
end
local held = issued_ms + life_ms > now_ms
local epoch_ms = math.floor(epoch_us / 1000)
local wiped = issued_ms < epoch_ms and held
local local_grant = granted_locally and confirmed and held
if not (wiped or local_grant) then
  return 0
end
if wiped then
  notice_loss(pass_ttl_ms)
end
if now_us >= hold_until() and active_count() >= capacity then
  return 0
end
redis.call('ZADD', active_key, int(now_ms + session_ttl_ms), id)
remove_from_line(id)
redis.call('HDEL', beat_key, id)
redis.call('ZREM', seen_key, id)
return 1
