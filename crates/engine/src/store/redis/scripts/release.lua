-- Release a lease if this node incarnation holds it under this term
-- (compare-and-delete), and tell waiting followers at once. The term makes a
-- release that arrives late (replayed after a reconnect) harmless: it cannot
-- delete a newer lease of the same node.
-- KEYS: lease, members, priorities
-- ARGV: node id, incarnation, term (0 when none is held: it matches no
--       lease, so only the withdrawal happens), wake channel
--       (P:g:{G}:released: a channel, so it comes in ARGV, not KEYS),
--       "1" to also withdraw candidacy
-- Returns 1 if the lease was released, 0 if it was not ours.
local lease_key = KEYS[1]
local members_key = KEYS[2]
local priorities_key = KEYS[3]
local id = ARGV[1]
local incarnation = ARGV[2]
local term = ARGV[3]
local wake_channel = ARGV[4]
local withdraw = ARGV[5]
if withdraw == '1' then
  redis.call('ZREM', members_key, id)
  redis.call('HDEL', priorities_key, id)
end
if redis.call('GET', lease_key) == id .. '#' .. incarnation .. '#' .. term then
  redis.call('DEL', lease_key)
  redis.call('PUBLISH', wake_channel, id)
  return 1
end
return 0
