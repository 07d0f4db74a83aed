-- raise: raise a fencing counter to at least a value (Redlock writes the
-- token of a grant back, right after the grant, to the nodes whose clock
-- would not pass it before the lease can expire there; see redlock.go).
--
-- KEYS[1]: the fencing counter key
-- ARGV[1]: the value, a decimal integer without leading zeros
--
-- Returns 1 when the counter was raised, 0 when it was at or above the
-- value (or is not a number: acquire.lua reports that). The comparison is
-- exact (on the decimal strings): Lua numbers are doubles, which cannot
-- tell neighbouring integers apart beyond 2^53. The same code is in
-- release.lua and refresh.lua.
local function below(c, v)
	if not c then
		return true
	end
	if not string.find(c, '^[1-9]%d*$') then
		local n = tonumber(c)
		return n ~= nil and n < tonumber(v)
	end
	if #c ~= #v then
		return #c < #v
	end
	return c < v
end
if below(redis.call('GET', KEYS[1]), ARGV[1]) then
	redis.call('SET', KEYS[1], ARGV[1])
	return 1
end
return 0
