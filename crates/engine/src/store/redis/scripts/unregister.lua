-- Remove a node at once (close), unless a newer incarnation owns the id.
-- KEYS: node hash
-- ARGV: prefix, node id, incarnation
-- Returns 1 removed, 0 left alone.
-- The removal is remove_node (remove_node.lua), which builds every other key
-- it touches from the prefix.
local incarnation = redis.call('HGET', KEYS[1], 'incarnation')
if incarnation and incarnation ~= ARGV[3] then return 0 end
remove_node(ARGV[1], ARGV[2])
return 1
