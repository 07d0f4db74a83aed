-- raise: raise a fencing counter to at least a value (Redlock writes the
-- token of a grant back to the nodes that granted it, so that a later
-- majority, which shares a node with this one, issues a larger token).
--
-- KEYS[1]: the fencing counter key
-- ARGV[1]: the value
--
-- Returns the counter afterwards.
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = tonumber(ARGV[1])
if c < v then
	redis.call('SET', KEYS[1], ARGV[1])
	return v
end
return c
