-- refresh: extend the lock's TTL if it is still ours.
--
-- KEYS[1]: the lock key
-- ARGV[1]: the ownership value of the grant being refreshed
-- ARGV[2]: the new TTL in whole milliseconds
--
-- Returns 1 when the lock was ours and now expires ARGV[2] ms from now, 0
-- when it was not ours. A missing key is never re-created.
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
