-- leave.lua: a visitor leaves the line or frees its slot.
--
-- KEYS: the route's six keys and its lanes' (see route.lua).
-- ARGV: [1] id (16 raw bytes)
-- Returns: 1 if the id was in line or active, 0 if unknown (both fine).
-- Invariant: afterwards the id is in neither waiting nor active, and seen
-- holds its tombstone (-now ms, forgotten abandon_after later by
-- admit_tick), so neither its ticket nor its pass is restored as a lost write.

if end_place(ARGV[1]) > 0 then
  return 1
end
return 0
