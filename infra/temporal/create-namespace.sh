#!/bin/sh
# One-shot (the `temporal-namespace` service): once the server answers, create the namespace the
# conductor uses and register the engine's search attributes on it (the list in
# engine/contracts/search_attributes.py; tests/integration/test_cluster.py checks them).
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

# a new namespace reaches every frontend's cache a few seconds after it is created
n=0
until listed=$(temporal operator search-attribute list --address "$address" -n "$namespace" 2>&1); do
    n=$((n + 1))
    [ "$n" -lt "$tries" ] || { echo "namespace: $namespace is not usable after $n tries: $listed"; exit 1; }
    echo "namespace: waiting for $namespace to be usable ($n/$tries)"
    sleep 2
done

for attribute in ConductorBatch=Keyword ConductorTask=Keyword ConductorDataset=Keyword \
                 ConductorPolicyVersion=Keyword ConductorReward=Double ConductorAgents=KeywordList; do
    name=${attribute%%=*}
    if ! echo "$listed" | grep -qw "$name"; then
        temporal operator search-attribute create --address "$address" -n "$namespace" \
            --name "$name" --type "${attribute#*=}"
    fi
done
echo "namespace: $namespace ready"
