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
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
if redis.call('GET', KEYS[1]) == ARGV[1] .. '#' .. ARGV[2] .. '#' .. ARGV[3] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[4], ARGV[1])
  return 1
end
return 0
