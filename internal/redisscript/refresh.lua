-- refresh: extend the lock's TTL if it is still ours.
--
-- KEYS[1]: the lock key
-- ARGV[1]: the ownership value of the grant being refreshed
-- ARGV[2]: the new TTL in whole milliseconds
--
-- Returns 1 when the lock was ours and now expires ARGV[2] ms from now, 0
-- when it was not ours. A missing key is never re-created. The value is
-- ARGV[1], or ARGV[1] .. '+' once a waiter has marked it (acquire.lua).
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == ARGV[1] .. '+' then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
