-- Concurrency: at most <b> requests in flight for a key, each holding a slot,
-- a member of a sorted set whose score is when its lease ends (us, Redis
-- time). A slot is a number the agent draws, unique among the fleet's held
-- slots; every slot is a lease that ends by itself (a gateway that died, a
-- client gone before its response).
--   a = a slot's lease, max_duration (us), b = limit (slots)
-- The cost is the slot: > 0 takes slot <cost>, < 0 gives slot -<cost> back,
-- 0 only reports. The slots held are those whose lease ends after now. A
-- take drops the ended leases and renews the key's expiry; taking a slot
-- held already (which the agent never does: a slot per request) renews its
-- lease and counts as a new one. A give-back reads nothing and reports
-- nothing (ok, 0 left, no retry, no reset: its reply is never shown), so it
-- costs Redis one ZREM. A denial's retry is when the oldest lease ends, at
-- most 1 s (CONC_RETRY_MAX_US: a slot is usually given back long before).
-- As check_conc() and apply_conc() in src/core/limiter.c.
local function concurrency_check(key, now, cost, life, limit)
	if cost < 0 then
		return 1, 0, 0, 0, 0, 0, 0, 0
	end
	local after = '(' .. string.format('%d', now)
	local held = redis.call('ZCOUNT', key, after, '+inf')
	local ok, rem_c = 1, limit - held
	if cost > 0 then
		if held + 1 > limit then ok = 0 end
		rem_c = rem_c - 1
	elseif held > limit then
		ok = 0
	end
	if rem_c < 0 then rem_c = 0 end
	local rem_u = limit - held
	if rem_u < 0 then rem_u = 0 end
	local retry, reset_c, reset_u = 0, 0, 0
	if ok == 0 or rem_u == 0 or rem_c == 0 then
		-- when the oldest lease ends (at most 1 s): asked only when it is said
		local w = life
		if held > 0 then
			local first = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES',
				'LIMIT', 0, 1)
			w = first[2] - now
		end
		if w > 1000000 then w = 1000000 end
		if ok == 0 then retry = w end
		if rem_u == 0 then reset_u = w end
		if rem_c == 0 then reset_c = w end
	end
	return ok, rem_c, rem_u, retry, reset_c, reset_u, 0, 0
end

local function concurrency_commit(key, now, cost, life)
	local fmt = string.format
	if cost < 0 then
		redis.call('ZREM', key, fmt('%d', -cost))
		return
	end
	redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', now))
	if cost > 0 then
		redis.call('ZADD', key, fmt('%d', now + life), fmt('%d', cost))
		redis.call('PEXPIRE', key, fmt('%d', math.ceil(life / 1000) + 1))
	end
end
