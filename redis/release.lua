-- release: delete the lock if it is still ours and wake the waiters.
--
-- KEYS[1]: the lock key
-- ARGV[1]: the ownership value of the grant being released
--
-- Returns 1 when the lock was ours and is now deleted, 0 when it was not
-- ours (released already, expired, or held by a newer holder): nothing was
-- changed then. The release notification goes to the channel KEYS[1] ..
-- ':released' (releaseSuffix in redis.go; same hash tag as the key), which
-- waiters subscribe to.
if redis.call('GET', KEYS[1]) == ARGV[1] then
	redis.call('DEL', KEYS[1])
	redis.call('PUBLISH', KEYS[1] .. ':released', '1')
	return 1
end
return 0
