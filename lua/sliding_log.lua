-- Sliding log: a sorted set with one member per token, scored by its time
-- (us). Exact over any window of <a> microseconds; memory grows with the
-- limit.
--   a = window length (us), b = limit (requests per window)
-- A call's work grows with the entries it trims and adds, and Redis runs
-- nothing else meanwhile: the config bounds the limit (at most 1,000 per
-- window, src/config.c), and a call adds at most LOG_ADD_MAX entries: a cost
-- above that is never admitted (its retry is a whole window), a batch is
-- granted no more (decide.lua), and a report (charged even over the limit)
-- records at most that many and never fills the log past limit + LOG_ADD_MAX
-- (<limit> entries at one instant already deny everything for a window).
ALG[3] = function(key, now, cost, win, limit)
	redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - win))
	local count = redis.call('ZCARD', key)
	local r = {}
	r.ok = (count + cost <= limit and cost <= LOG_ADD_MAX) and 1 or 0
	r.rem_c = clamp0(limit - clamp0(count + cost))
	r.rem_u = clamp0(limit - count)
	if r.ok == 1 then
		r.retry = 0
	elseif cost > limit or cost > LOG_ADD_MAX then
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
			redis.call('ZPOPMAX', key, math.min(-cost, LOG_ADD_MAX))
			return
		end
		local add = math.min(cost, LOG_ADD_MAX, limit + LOG_ADD_MAX - count)
		if add < 1 then return end
		if redis.call('ZCOUNT', key, now, now) == 0 then
			-- members "<now>:<i>" are new: one command for all (in slices,
			-- under Lua's limit on unpack)
			local score = string.format('%d', now)
			local prefix = score .. ':'
			for s = 1, add, 500 do
				local args, j = {}, 0
				for i = s, math.min(s + 499, add) do
					args[j + 1] = score
					args[j + 2] = prefix .. i
					j = j + 2
				end
				redis.call('ZADD', key, unpack(args))
			end
		else
			-- another call at the same microsecond: find free names
			for i = 1, add do
				local m = string.format('%d:%d', now, i)
				local n = 0
				while redis.call('ZADD', key, 'NX', now, m) == 0 and n < 1000 do
					n = n + 1
					m = string.format('%d:%d:%d', now, i, n)
				end
			end
		end
		redis.call('PEXPIRE', key, math.ceil(win / 1000) + 1)
	end
	return r
end
