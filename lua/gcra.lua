-- GCRA (generic cell rate algorithm): a token bucket kept as one number, the
-- theoretical arrival time (TAT) in microseconds of Redis time.
--   a = emission interval T (us per token), b = burst tolerance tau (= T * burst)
ALG[1] = function(key, now, cost, T, tau)
	local tat = tonumber(redis.call('GET', key) or 0) or 0
	if tat < now then tat = now end
	local newtat = tat + T * cost
	if newtat < now then newtat = now end -- a refund never goes past full
	local r = {}
	r.ok = (newtat - tau <= now) and 1 or 0
	r.rem_c = math.floor(clamp0(tau - (newtat - now)) / T)
	r.rem_u = math.floor(clamp0(tau - (tat - now)) / T)
	r.retry = (r.ok == 1) and 0 or (newtat - tau - now)
	r.reset_c = newtat - now
	r.reset_u = tat - now
	r.commit = function()
		local ttl = math.ceil((newtat - now) / 1000)
		if ttl < 1 then ttl = 1 end
		redis.call('SET', key, string.format('%d', newtat), 'PX', ttl)
	end
	return r
end
