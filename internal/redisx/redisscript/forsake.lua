-- forsake: the clean-up of an exclusive acquire given up by its caller
-- (the single-Redis backend): delete the lock if the acquire took it (as
-- release.lua does), and leave a tombstone of its value (bury, in cut.lua,
-- prepended to this script) so that the acquire, if it is still on its way
-- to the server, takes nothing when it arrives (issue.lua refuses it).
--
-- KEYS[1]: the lock key
-- KEYS[2]: the fencing counter key (same hash slot)
-- ARGV[1]: the value of the acquire given up
-- ARGV[2]: how long the tombstone is in force, in whole milliseconds
--
-- Returns release.lua's reply: 1 when the lock was the acquire's and is
-- now deleted, 0 when it was not (the acquire did not take it, or has not
-- arrived yet), 2 when it was deleted but the PUBLISH that wakes its
-- waiters failed.
local t = redis.call('TIME')
bury(KEYS[2], ARGV[1], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), tonumber(ARGV[2]))
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
	redis.call('DEL', KEYS[1])
	return 1
end
if v == ARGV[1] .. '+' then
	redis.call('DEL', KEYS[1])
	local r = redis.pcall('PUBLISH', KEYS[1] .. ':released', '1')
	if type(r) == 'table' and r.err then
		return 2
	end
	return 1
end
return 0
