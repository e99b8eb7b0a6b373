-- Sliding log: a sorted set with one member per token, scored by its time
-- (us). Exact over any window of <a> microseconds; memory grows with the
-- limit.
--   a = window length (us), b = limit (requests per window)
-- A call's work grows with the entries it trims and adds, and Redis runs
-- nothing else meanwhile: the config bounds the limit (at most 1,000 per
-- window, src/config/config.c), and a call adds at most LOG_ADD_MAX = 100 entries: a
-- cost above that is never admitted (its retry is a whole window), a batch is
-- granted no more (decide.lua), and a report (charged even over the limit)
-- records at most that many and never fills the log past limit + LOG_ADD_MAX
-- (<limit> entries at one instant already deny everything for a window).
-- State for the commit: s1 = the entries in the window before this request.
local function sliding_log_check(key, now, cost, win, limit)
	local call = redis.call
	local LOG_ADD_MAX = 100
	call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - win))
	local count = call('ZCARD', key)
	local ok = (count + cost <= limit and cost <= LOG_ADD_MAX) and 1 or 0
	local after = count + cost
	if after < 0 then after = 0 end
	local rem_c, rem_u = 0, 0
	if limit > after then rem_c = limit - after end
	if limit > count then rem_u = limit - count end
	local retry = 0
	if ok == 1 then
		retry = 0
	elseif cost > limit or cost > LOG_ADD_MAX then
		retry = win
	else
		-- the oldest entries must leave until cost more fit
		local e = call('ZRANGE', key, count + cost - limit - 1,
			count + cost - limit - 1, 'WITHSCORES')
		retry = tonumber(e[2]) + win - now
	end
	local newest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
	local reset_u = 0
	if newest[2] then reset_u = tonumber(newest[2]) + win - now end
	local reset_c = reset_u
	if cost > 0 then reset_c = win end
	return ok, rem_c, rem_u, retry, reset_c, reset_u, count
end

local function sliding_log_commit(key, now, cost, win, limit, count)
	local call, fmt, min = redis.call, string.format, math.min
	local LOG_ADD_MAX = 100
	if cost < 0 then -- a refund takes back the newest entries
		call('ZPOPMAX', key, min(-cost, LOG_ADD_MAX))
		return
	end
	local add = min(cost, LOG_ADD_MAX, limit + LOG_ADD_MAX - count)
	if add < 1 then return end
	if call('ZCOUNT', key, now, now) == 0 then
		-- members "<now>:<i>" are new: one command for all (in slices,
		-- under Lua's limit on unpack)
		local score = fmt('%d', now)
		local prefix = score .. ':'
		for s = 1, add, 500 do
			local args, j = {}, 0
			for i = s, min(s + 499, add) do
				args[j + 1] = score
				args[j + 2] = prefix .. i
				j = j + 2
			end
			call('ZADD', key, unpack(args))
		end
	else
		-- another call at the same microsecond: find free names
		for i = 1, add do
			local m = fmt('%d:%d', now, i)
			local n = 0
			while call('ZADD', key, 'NX', now, m) == 0 and n < 1000 do
				n = n + 1
				m = fmt('%d:%d:%d', now, i, n)
			end
		end
	end
	call('PEXPIRE', key, math.ceil(win / 1000) + 1)
end
