-- Fixed window: a counter per window of <a> microseconds, windows aligned on
-- the Unix epoch, so a 1d window resets at 00:00 UTC and 1h on the hour.
-- The key holds "<window index>:<count>".
--   a = window length (us), b = limit (requests per window)
-- State for the commit: s1 = the count before this request.
local function fixed_window_check(key, now, cost, win, limit)
	local idx = math.floor(now / win)
	local count = 0
	local v = redis.call('GET', key)
	if v then
		local w, c = string.match(v, '^(%d+):(%d+)$')
		if w and w + 0 == idx then
			count = c + 0
			if count > 2 ^ 50 then count = 2 ^ 50 end -- COUNT_MAX
		end
	end
	local left = (idx + 1) * win - now
	local after = count + cost
	if after < 0 then after = 0 end
	local rem_c, rem_u = 0, 0
	if limit > after then rem_c = limit - after end
	if limit > count then rem_u = limit - count end
	local reset_u = 0
	if count > 0 then reset_u = left end
	if count + cost <= limit then
		return 1, rem_c, rem_u, 0, left, reset_u, count
	end
	return 0, rem_c, rem_u, left, left, reset_u, count
end

local function fixed_window_commit(key, now, cost, win, limit, count, _, cache)
	local idx = math.floor(now / win)
	local left = (idx + 1) * win - now
	local c = count + cost
	if c < 0 then c = 0 elseif c > 2 ^ 50 then c = 2 ^ 50 end -- COUNT_MAX
	local ttl = math.ceil(left / 1000) + 1
	local px = cache and cache[ttl]
	if not px then
		px = string.format('%d', ttl)
		if cache then cache[ttl] = px end
	end
	redis.call('SET', key, string.format('%d:%d', idx, c), 'PX', px)
end
