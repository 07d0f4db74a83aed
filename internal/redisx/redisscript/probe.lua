-- probe: run once when a backend is opened (CheckRights in redisscript.go)
-- to learn whether this user may run, on a lock key under the prefix, its
-- counter key and its release channel, every command the lock scripts
-- call. A script's calls are checked against the user's ACL one by one,
-- and redis.pcall returns a refusal instead of ending the script, so one
-- run finds every right that is missing.
--
-- KEYS[1]: a probe lock key under the prefix, which no lock uses
-- KEYS[2]: its fencing counter key (same hash slot)
-- KEYS[3], KEYS[4]: with ARGV[1] 'shared' (the single-Redis backend, which
--          serves shared leases; see shared.lua): its holders and tokens
--          keys (same slot), on which the commands of the shared-lease
--          scripts and of its Inspect (inspect.lua) are tried too
--
-- Returns the calls that failed, flat: for each, the command (lower case),
-- the key or channel it named ('' for none) and the error; an empty array
-- when every call passed. Nothing is left behind: the keys are created
-- with a 10s TTL (an APPEND or INCR is tried only on a key the SET has
-- created) and deleted at the end; the PUBLISH is on the probe key's
-- channel, which no one watches.
local out = {}
local function try(target, ...)
	local r = redis.pcall(...)
	if type(r) == 'table' and r.err then
		out[#out + 1] = string.lower((...))
		out[#out + 1] = target
		out[#out + 1] = r.err
		return nil
	end
	return r
end
local k, c = KEYS[1], KEYS[2]
try(k, 'GET', k)
try(k, 'PTTL', k)
if try(k, 'SET', k, 'probe', 'PX', '10000') then
	try(k, 'APPEND', k, '+')
	try(k, 'PEXPIRE', k, '10000')
end
if try(c, 'SET', c, '1', 'PX', '10000') then
	try(c, 'INCR', c)
end
try(k, 'DEL', k, c)
if ARGV[1] == 'shared' then
	-- inspect.lua's reads of a lock value (on the probe key, missing by
	-- now) and of the holders' tokens (below).
	try(k, 'GETRANGE', k, '0', '1')
	try(k, 'STRLEN', k)
	local z, h = KEYS[3], KEYS[4]
	if try(z, 'ZADD', z, '1', 'probe') then
		try(z, 'PEXPIRE', z, '10000')
		try(z, 'ZSCORE', z, 'probe')
		try(z, 'ZRANGE', z, '0', '-1')
		try(z, 'ZCARD', z)
		try(z, 'ZREM', z, 'probe')
	end
	if try(h, 'HSET', h, 'probe', '1') then
		try(h, 'PEXPIRE', h, '10000')
		try(h, 'HGET', h, 'probe')
		try(h, 'HGETALL', h)
		local t = try('', 'TIME')
		if t then
			try(h, 'PEXPIREAT', h, tostring(tonumber(t[1]) + 10) .. '000')
		end
		try(h, 'HDEL', h, 'probe')
	end
	try(z, 'DEL', z, h)
end
local ch = k .. ':released'
try(ch, 'PUBLISH', ch, '1')
try('', 'TIME')
return out
