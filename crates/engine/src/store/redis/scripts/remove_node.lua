-- Shared by sweep and unregister: delete a node and everything hanging off it.
-- Key names are built here from the prefix, in the shapes store/redis/keys.rs and
-- docs/architecture.md give.
-- Needs topics.lua.
local function remove_node(prefix, id)
  local node_key = prefix .. ':node:' .. id
  local groups = redis.call('HGET', node_key, 'groups')
  if groups then
    for group in string.gmatch(groups, '[^,]+') do
      redis.call('ZREM', prefix .. ':g:{' .. group .. '}:members', id)
      redis.call('HDEL', prefix .. ':g:{' .. group .. '}:priorities', id)
    end
  end
  local subs_key = node_key .. ':subs'
  for _, sub in ipairs(redis.call('SMEMBERS', subs_key)) do
    redis.call('SREM', prefix .. ':topic:' .. sub .. ':subs', id)
    forget_if_unused(prefix, sub)
  end
  redis.call('DEL', node_key, subs_key, node_key .. ':inbox', node_key .. ':commands')
  redis.call('ZREM', prefix .. ':nodes', id)
  redis.call('HDEL', prefix .. ':limits', id)
  redis.call('HDEL', prefix .. ':packed', id)
end
