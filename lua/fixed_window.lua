-- Fixed window: a counter per window of <a> microseconds, windows aligned on
-- the Unix epoch, so a 1d window resets at 00:00 UTC and 1h on the hour.
-- The key holds "<window index>:<count>".
--   a = window length (us), b = limit (requests per window)
ALG[2] = function(key, now, cost, win, limit)
	local idx = math.floor(now / win)
	local count = 0
	local v = redis.call('GET', key)
	if v then
		local w, c = string.match(v, '^(%d+):(%d+)$')
		if w and tonumber(w) == idx then count = math.min(tonumber(c), COUNT_MAX) end
	end
	local left = (idx + 1) * win - now
	local r = {}
	r.ok = (count + cost <= limit) and 1 or 0
	r.rem_c = clamp0(limit - clamp0(count + cost))
	r.rem_u = clamp0(limit - count)
	r.retry = (r.ok == 1) and 0 or left
	r.reset_c = left
	r.reset_u = (count > 0) and left or 0
	r.commit = function()
		local c = math.min(clamp0(count + cost), COUNT_MAX)
		redis.call('SET', key, string.format('%d:%d', idx, c), 'PX', math.ceil(left / 1000) + 1)
	end
	return r
end
