wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"hello","max_tokens":256}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer x"
