-- Sliding log: a sorted set with one member per token, scored by its time
-- (us). Exact over any window of <a> microseconds; memory grows with the
-- limit.
--   a = window length (us), b = limit (requests per window)
ALG[3] = function(key, now, cost, win, limit)
	redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - win))
	local count = redis.call('ZCARD', key)
	local r = {}
	r.ok = (count + cost <= limit) and 1 or 0
	r.rem_c = clamp0(limit - clamp0(count + cost))
	r.rem_u = clamp0(limit - count)
	if r.ok == 1 then
		r.retry = 0
	elseif cost > limit then
		r.retry = win
	else
		-- the oldest entries must leave until cost more fit
		local e = redis.call('ZRANGE', key, count + cost - limit - 1,
			count + cost - limit - 1, 'WITHSCORES')
		r.retry = tonumber(e[2]) + win - now
	end
	local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
	r.reset_u = 0
	if newest[2] then r.reset_u = tonumber(newest[2]) + win - now end
	r.reset_c = (cost > 0) and win or r.reset_u
	r.commit = function()
		if cost < 0 then -- a refund takes back the newest entries
			redis.call('ZPOPMAX', key, -cost)
			return
		end
		for i = 1, cost do
			local m = string.format('%d:%d', now, i)
			local n = 0
			while redis.call('ZADD', key, 'NX', now, m) == 0 and n < 1000 do
				n = n + 1
				m = string.format('%d:%d:%d', now, i, n)
			end
		end
		redis.call('PEXPIRE', key, math.ceil(win / 1000) + 1)
	end
	return r
end
