-- raise: raise a fencing counter to at least a value (Redlock writes the
-- token of a grant back, right after the grant, to the nodes whose clock
-- would not pass it before the lease can expire there; see redlock.go).
--
-- KEYS[1]: the fencing counter key
-- ARGV[1]: the value, a decimal integer without leading zeros
--
-- Returns 1 when the counter was raised, 0 when it was at or above the
-- value (or is not a number: acquire.lua reports that). below is in
-- below.lua, prepended to this script.
if below(redis.call('GET', KEYS[1]), ARGV[1]) then
	redis.call('SET', KEYS[1], ARGV[1])
	return 1
end
return 0
