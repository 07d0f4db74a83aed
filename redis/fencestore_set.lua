-- set: write a value only with a token at least the highest seen.
--
-- KEYS[1]: the data key
-- KEYS[2]: the key of the highest token written to KEYS[1]
-- ARGV[1]: the value
-- ARGV[2]: the write's token, as 20 decimal digits (so that string order
--          is numeric order)
--
-- Returns "OK" when the value was written, else the highest token (the
-- write was stale and changed nothing).
--
-- The tokens are compared as strings, never with tonumber: a Lua number is
-- a double, which cannot tell 2^53 from 2^53+1 (so 2^53 would pass after
-- 2^53+1).
local highest = redis.call('GET', KEYS[2])
if highest and ARGV[2] < highest then
	return highest
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 'OK'
