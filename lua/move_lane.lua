-- move_lane.lua: moves a waiter to another lane, keeping its join score.
--
-- KEYS: the route's six keys and its lanes' (see route.lua).
-- ARGV: [1] id (16 raw bytes)  [2] the lane to move to (1-based among the
--       lanes' keys)
-- Returns: 1 if the id was waiting (now in that lane), 0 if not.
-- Invariant: a waiter is in one lane at a time, at the score it joined
-- with, so its place among the lane's waiters is where that score puts it;
-- its last poll (beat) is untouched.

local id = ARGV[1]
local to = tonumber(ARGV[2])
if not lane_keys[to] then
  to = 1
end
local from, score = find_lane(id)
if not from then
  return 0
end
if from ~= to then
  redis.call('ZREM', lane_keys[from], id)
  put_in_lane(to, score, id)
end
return 1
