#!/bin/sh
# One-shot (the `temporal-namespace` service): once the server answers, create the namespace the
# conductor uses and register the engine's search attributes on it (the list in
# engine/contracts/search_attributes.py; tests/integration/test_compose_stack.py checks them).
# The worker would add missing ones too, but several workers starting at once would race.
set -eu
address=${TEMPORAL_ADDRESS:-temporal:7233}
namespace=${NAMESPACE:-default}
retention=${NAMESPACE_RETENTION:-7d}
tries=${TRIES:-60}

n=0
until temporal operator cluster health --address "$address" >/dev/null 2>&1; do
    n=$((n + 1))
    [ "$n" -lt "$tries" ] || { echo "namespace: Temporal at $address is not healthy after $n tries"; exit 1; }
    echo "namespace: waiting for Temporal at $address ($n/$tries)"
    sleep 2
done

if temporal operator namespace describe --address "$address" -n "$namespace" >/dev/null 2>&1; then
    echo "namespace: $namespace exists"
else
    temporal operator namespace create --address "$address" -n "$namespace" --retention "$retention"
fi

for attribute in ConductorBatch=Keyword ConductorTask=Keyword ConductorDataset=Keyword \
                 ConductorPolicyVersion=Keyword ConductorReward=Double ConductorAgents=KeywordList; do
    name=${attribute%%=*}
    if temporal operator search-attribute list --address "$address" -n "$namespace" | grep -qw "$name"; then
        continue
    fi
    temporal operator search-attribute create --address "$address" -n "$namespace" \
        --name "$name" --type "${attribute#*=}"
done
echo "namespace: $namespace ready"
