-- acquireshared: take a shared lease (a semaphore's permit, or a reader's
-- lease of a read-write lock) if the key allows one, and issue a fencing
-- token. The single-Redis backend only; the layout of a key held by
-- shared leases is in shared.lua, prepended to this script with issue.lua
-- and cut.lua.
--
-- KEYS[1]: the lock key
-- KEYS[2]: the holders (sorted set; same hash slot as KEYS[1])
-- KEYS[3]: the holders' tokens (hash; same slot)
-- KEYS[4]: the fencing counter key (same slot), shared with exclusive
--          grants: tokens increase over all grants on the key
-- ARGV[1]: the lease's value, unique per grant (as acquire.lua's ARGV[1])
-- ARGV[2]: the TTL in whole milliseconds
-- ARGV[3]: the semaphore's permits (a decimal integer without leading
--          zeros, compared as a string; 0: a reader)
-- ARGV[4]: the counter's TTL in whole milliseconds for a grant whose token
--          is the server clock, or '' for a counter that never expires
--          (as acquire.lua's ARGV[4])
--
-- Returns the token (a decimal string, > 0) when the lease is granted;
-- when the key is held so that no shared lease can be granted now, it
-- marks the lock key as waited for (as acquire.lua does) and returns -2 -
-- ms, where ms bounds how long the key stays so (an exclusive holder's or
-- a reservation's PTTL, -1 without one; the time until the first shared
-- holder expires); and when the key's shared holders asked for another
-- number of permits, the error reply 'DLOCKPERMITS <theirs>', having
-- changed nothing (the request neither waits nor takes anything); -1 when
-- the lease would be granted but its value has a tombstone in the counter
-- (cut.lua: its acquire was given up and cleaned up before it arrived),
-- having changed nothing either.
--
-- The grant rule: the key is free (or its holders have all expired and no
-- writer waits), or it is held by shared leases of the same permits, no
-- writer waits (the until in the lock value has passed), and fewer than
-- permits of them hold (any number of readers). An exclusive holder, a
-- reservation for writers and a waiting writer keep shared requests out,
-- the writer also once the holders it waited for have expired (the lock
-- key lives until its time, see shared.lua).
--
-- The script may safely run twice: a resent acquire (go-redis retries
-- after network errors) finds its own lease among the holders and returns
-- the token of the first run (writing it again, a replicated write for a
-- WAIT that follows, as acquire.lua does).
local now, nowus = clock()
local v = redis.call('GET', KEYS[1])
local kind, permits, w, marked = parse(v)
-- pttl is the lock key's PTTL, 1 for a key about to expire (0): a waiter
-- then tries again right after it, and marks what holds the key then.
local function pttl()
	local p = redis.call('PTTL', KEYS[1])
	if p == 0 then
		return 1
	end
	return p
end
if v and not kind then
	-- An exclusive holder (or a value planted by something else): mark
	-- it as acquire.lua does, so that its release is published.
	if string.byte(v, -1) ~= 43 then
		redis.call('APPEND', KEYS[1], '+')
	end
	return -2 - pttl()
end
-- held marks the lock value (once) and returns the refusal.
local function held(left)
	if not marked then
		redis.call('APPEND', KEYS[1], '+')
	end
	return -2 - left
end
if kind == 'w' then
	if w > now then
		return held(pttl())
	end
	-- The reservation has run out (it expires this very millisecond).
	kind = nil
end
local n = 0
if kind == 's' then
	n = prune(KEYS[2], KEYS[3], now)
	if n == 0 then
		-- Every holder has expired. A writer that waits keeps the key as
		-- a reservation would (the lock key lives until its time).
		if w > now then
			return held(w - now)
		end
		kind = nil
	end
end
if kind == 's' then
	if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
		-- A retry of this very acquire whose first reply was lost.
		local token = redis.call('HGET', KEYS[3], ARGV[1])
		if not token then
			return redis.error_reply('dlock: the token of a shared lease vanished while it was held')
		end
		redis.call('HSET', KEYS[3], ARGV[1], token)
		return token
	end
	if permits ~= ARGV[3] then
		return redis.error_reply('DLOCKPERMITS ' .. permits)
	end
	if w > now or (permits ~= '0' and n >= tonumber(permits)) then
		return held(earliest(KEYS[2], now))
	end
end
-- Granted, unless a tombstone refuses it: issued before anything else is
-- written, so that a refusal has nothing to undo.
local token = issue(KEYS[4], nowus, ARGV[4], ARGV[1])
if not token then
	return -1
end
if kind ~= 's' then
	-- Free: this lease is the first. Holders and tokens left by a lock
	-- key that went early (a DEL) belong to no valid lease; the mark of
	-- an expired value stays for its waiters.
	redis.call('DEL', KEYS[2], KEYS[3])
	redis.call('SET', KEYS[1], sentinel(ARGV[3], 0, marked))
	w = 0
end
redis.call('ZADD', KEYS[2], ms(now + tonumber(ARGV[2])), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], token)
expire(KEYS[1], KEYS[2], KEYS[3], w)
return token
