-- fence: raise a fencing counter that was lost to the server's clock, and
-- issue the next token. Run only by the holder of the lock, and only when
-- the acquire's INCR showed that the counter had been lost (its value was
-- below the clock floor, see doc.go).
--
-- KEYS[1]: the fencing counter key
--
-- Returns the token: max(counter + 1, server time in microseconds), stored
-- in the counter. TIME before a write is allowed because scripts replicate
-- their effects (the default since Redis 5, the only mode since Redis 7).
local t = redis.call('TIME')
-- TIME gives seconds and microseconds as decimal strings; their
-- concatenation (microseconds zero-padded to 6 digits) is the time in
-- microseconds, written without a float-to-string conversion.
local us = t[2]
local now = t[1] .. string.rep('0', 6 - #us) .. us
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if last < tonumber(now) then
	redis.call('SET', KEYS[1], now)
	return tonumber(now)
end
return redis.call('INCR', KEYS[1])
