u=pdinfra-vllm-decode0; url=http://198.18.0.12:8200/health
t0=$(date +%s.%N); systemctl restart $u --no-block; sleep 2
for i in $(seq 1 300); do curl -sf -o /dev/null $url && break; sleep 1; done
t1=$(date +%s.%N); python3 -c "print(\"restart-to-health %.1f s\" % ($t1 - $t0))"
