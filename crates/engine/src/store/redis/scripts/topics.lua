-- Shared by the messaging scripts: subscription bookkeeping and the topic
-- matching rule, the only copy of it (inbox/topic.rs validates names;
-- tests/messaging.rs pins the matching).
local function is_pattern(sub)
  return string.find(sub, '[*>]') ~= nil
end
local function matches(pattern, topic)
  local segments = {}
  for s in string.gmatch(topic, '[^.]+') do segments[#segments + 1] = s end
  local i = 0
  for p in string.gmatch(pattern, '[^.]+') do
    i = i + 1
    if p == '>' then return i <= #segments end
    if i > #segments then return false end
    if p ~= '*' and p ~= segments[i] then return false end
  end
  return i == #segments
end
-- Subscribe node `id` to `sub` in both directions.
local function add_subscription(prefix, id, sub)
  redis.call('SADD', prefix .. ':node:' .. id .. ':subs', sub)
  redis.call('SADD', prefix .. ':topic:' .. sub .. ':subs', id)
  if is_pattern(sub) then redis.call('SADD', prefix .. ':patterns', sub) end
end
-- A pattern nobody subscribes to any more leaves the pattern index.
local function forget_if_unused(prefix, sub)
  if is_pattern(sub) and redis.call('SCARD', prefix .. ':topic:' .. sub .. ':subs') == 0 then
    redis.call('SREM', prefix .. ':patterns', sub)
  end
end
