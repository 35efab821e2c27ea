-- Release a lease if this node incarnation holds it (compare-and-delete), and
-- tell waiting followers at once.
-- KEYS: lease, members
-- ARGV: node id, incarnation, wake channel, "1" to also withdraw candidacy
-- Returns 1 if the lease was released, 0 if it was not ours.
local me = ARGV[1] .. '#' .. ARGV[2]
if ARGV[4] == '1' then redis.call('ZREM', KEYS[2], ARGV[1]) end
if redis.call('GET', KEYS[1]) == me then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[1])
  return 1
end
return 0
