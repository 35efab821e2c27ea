-- Set one field of a node's registration, only while this incarnation owns
-- it: after a sweep (or a newer incarnation) the hash is not recreated or
-- overwritten; the next registration writes the field anyway.
-- KEYS: node hash
-- ARGV: incarnation, field, value
-- Returns 1 written, 0 left alone.
if redis.call('HGET', KEYS[1], 'incarnation') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
