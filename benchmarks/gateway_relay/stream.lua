wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"hello","stream":true,"max_tokens":256}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer x"
