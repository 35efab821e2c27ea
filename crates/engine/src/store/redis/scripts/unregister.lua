-- Remove a node at once (close), unless a newer incarnation owns the id.
-- KEYS: node hash
-- ARGV: prefix, node id, incarnation
-- Returns 1 removed, 0 left alone.
-- The removal is remove_node (remove_node.lua), which builds every other key
-- it touches from the prefix.
local node_key = KEYS[1]
local prefix = ARGV[1]
local id = ARGV[2]
local incarnation = ARGV[3]
local registered = redis.call('HGET', node_key, 'incarnation')
if registered and registered ~= incarnation then return 0 end
remove_node(prefix, id)
return 1
