-- Set one field of a node's registration, only while this incarnation owns
-- it: after a sweep (or a newer incarnation) the hash is not recreated or
-- overwritten; the next registration writes the field anyway.
-- KEYS: node hash
-- ARGV: incarnation, field, value
-- Returns 1 written, 0 left alone.
local node_key = KEYS[1]
local incarnation = ARGV[1]
local field = ARGV[2]
local value = ARGV[3]
if redis.call('HGET', node_key, 'incarnation') ~= incarnation then return 0 end
redis.call('HSET', node_key, field, value)
return 1
