package harness

import "time"

// Every duration the suite waits, polls, sleeps or runs for, in one place (shaped like Kueue's
// test/util/constants.go: Timeout, LongTimeout, ConsistentDuration, Interval). Each says where
// its number comes from. The machine is 2 cores shared by several control planes, Kueues and
// brokers at once, so the bounds are wider than Kueue's own (30 s on a dedicated runner); a
// warm run takes seconds for each of them. Changing one changes what the suite asserts: none
// may be widened to make a run pass.

// Polling intervals.
const (
	// Interval is how often a wait looks again: Kueue's own test/util Interval (250 ms).
	Interval = 250 * time.Millisecond
	// FastInterval is for waits whose end is a figure the test prints or compares (the first
	// 401 after a revocation, the next upstream fetch) and for a local process coming up.
	FastInterval = 100 * time.Millisecond
	// SlowInterval is for a wait whose every look is costly (a Deployment's rollout lists the
	// pods to say why it is not done).
	SlowInterval = time.Second
	// SampleInterval is how often a steady-state window samples a MultiKueueCluster's Active
	// condition (e2e/README.md: "the clusters Active in every sample (each 250 ms)").
	SampleInterval = 250 * time.Millisecond
)

// What Kueue does, seen on the hub's API server.
const (
	// Timeout bounds what Kueue does after a change: a MultiKueueCluster turning Active after
	// its ClusterProfile is created or its connections are cut (Kueue's first retry comes
	// 5 s after a failed attempt: multikueuecluster.go's retryIncrement), a Job admitted on a
	// worker, a condition or a log line showing a failure, the broker asked again.
	Timeout = 2 * time.Minute
	// ShortTimeout bounds what follows at once from something the test already saw: the
	// condition of a cluster with no credential (it never connected: its first attempt
	// fails), a cluster Active again once its first 401 was seen, the Job submitted during a
	// short outage (the cluster never stopped being Active).
	ShortTimeout = time.Minute
	// LogLineTimeout bounds the shim's line reaching Kueue's log once the condition it caused
	// was seen (client-go passes the plugin's stderr through as it runs).
	LogLineTimeout = 30 * time.Second
	// FanOutTimeout bounds twelve MultiKueueClusters turning Active at once
	// (TestSharedIdentityFanOut): twelve clients, twelve discoveries.
	FanOutTimeout = 3 * time.Minute
	// RecoveryTimeout bounds a cluster turning Active by itself after a long outage: Kueue
	// retries a cluster that failed after 5 s doubled per failed attempt, up to 320 s
	// (multikueuecluster.go's retryIncrement, retryMaxSteps), so after minutes of failures the
	// next attempt may be minutes away.
	RecoveryTimeout = 4 * time.Minute
	// NudgeAfter is how long a Job may wait for admission before the test annotates its
	// Workload: a Job that got its quota while MultiKueue was (re)connecting to its only
	// worker waits for the next event on its Workload (Kueue v0.19.2 does not requeue waiting
	// workloads when a worker connects); one Kueue dispatches by itself is admitted in seconds.
	NudgeAfter = 20 * time.Second
	// NudgeAfterRecovery is NudgeAfter for a Job submitted during an outage, looked at only once
	// the cluster is Active again and a later Job was admitted: one Kueue dispatches by itself
	// is admitted by then or within seconds.
	NudgeAfterRecovery = 15 * time.Second
	// NudgeRetryTimeout bounds a nudge's retries: a Workload that Kueue replaces (deletes and
	// recreates when a new manager finds it out of date) is back within seconds.
	NudgeRetryTimeout = 15 * time.Second
	// ConsistentDuration is how long a Job must stay unadmitted while it cannot be dispatched
	// (the broker down and the token revoked): the suite's former one-second look, kept.
	ConsistentDuration = time.Second
)

// Credentials and their caches.
const (
	// TokenCacheWait is what a revocation waits before it bites: kube-apiserver keeps a
	// successful token authentication for 10 s whatever the webhook's cache TTL (its
	// --token-success-cache-ttl default, no flag), plus a second.
	TokenCacheWait = 11 * time.Second
	// ShortLifetime is the life of the credentials the lifecycle and steady-state scenarios
	// hand out: short enough that client-go runs the shim again, and the broker refreshes,
	// several times within minutes. The broker refreshes at about half of it (40–60 %,
	// jittered) and serves a credential until a quarter of it before expiry
	// (broker/src/engine/cache.rs: REFRESH_FRACTION, STALE_MARGIN).
	ShortLifetime = 60 * time.Second
	// TwoRefreshesWithin bounds two refreshes in a row: each comes at most a lifetime after
	// the one before (the caller's next call past the refresh time).
	TwoRefreshesWithin = 4 * ShortLifetime
	// NextRefreshWithin bounds the next upstream fetch: at most a lifetime away, plus the
	// caller's next call.
	NextRefreshWithin = 2 * ShortLifetime
	// RefreshScheduleSlack is what the refresh schedule's lower bound (40 % of the life
	// between two fetches) allows: runs.log's times are the token plugin's own, taken after
	// the broker decided to fetch, so two of them can be a little closer than its decisions.
	RefreshScheduleSlack = time.Second
	// ServingWindowEndsWithin bounds a long outage's effect: the held credential is served
	// until a quarter of its life before expiry, then the shim fails and Kueue's next
	// request shows it.
	ServingWindowEndsWithin = 3 * ShortLifetime
	// MountedSecretTimeout bounds the kubelet putting a changed Secret into the pod's volume,
	// which it does at its next sync of the pod (the node's syncFrequency: 10 s).
	MountedSecretTimeout = time.Minute
	// ServiceAccountGoneTimeout bounds a deleted ServiceAccount disappearing (no finalizer:
	// the API server removes it at once).
	ServiceAccountGoneTimeout = 30 * time.Second
)

// Scenario rhythms.
const (
	// SteadyDefault is how long TestSteadyState watches unless CREDBROKER_E2E_STEADY_SECS says
	// otherwise: two credential lifetimes, four connection cuts, the ClusterProfile change
	// halfway.
	SteadyDefault = 2 * ShortLifetime
	// SteadyCutEvery is how often TestSteadyState cuts every connection, as load balancers and
	// API server restarts do.
	SteadyCutEvery = 30 * time.Second
	// BusyCutEvery is how often TestCredentialLifecycle cuts the worker's connections so that
	// Kueue, whose watches stay open, makes requests often (as a busy hub does).
	BusyCutEvery = 5 * time.Second
)

// Processes: start, readiness, stop.
const (
	// ControlPlaneStartTimeout bounds envtest starting one etcd and kube-apiserver: the hub
	// and the workers start together on 2 cores.
	ControlPlaneStartTimeout = 3 * time.Minute
	// ControlPlaneStopTimeout bounds envtest stopping them.
	ControlPlaneStopTimeout = time.Minute
	// KueueReadyTimeout bounds Kueue's manager answering /readyz: its webhooks and caches
	// come up after the CRDs' informers sync, slow while other control planes start.
	KueueReadyTimeout = 3 * time.Minute
	// BrokerHealthTimeout bounds the broker passing `credbroker health` after it starts
	// (it serves in milliseconds: this bounds a broker that never does).
	BrokerHealthTimeout = 30 * time.Second
	// BrokerHealthCallTimeout is `credbroker health --timeout`: one call on a local socket.
	BrokerHealthCallTimeout = 2 * time.Second
	// NodeStartTimeout bounds the node's start (containerd, kubelet registered and Ready):
	// seconds when warm; the 2-core machine under the rest of the suite is slower.
	NodeStartTimeout = 2 * time.Minute
	// ContainerdSocketTimeout bounds containerd creating its CRI socket.
	ContainerdSocketTimeout = time.Minute
	// SandboxRemovalTimeout bounds removing every pod sandbox through the CRI at the node's
	// stop (containerd stops the containers and runs the CNI plugins' DEL).
	SandboxRemovalTimeout = time.Minute
	// KueueDeployTimeout bounds the manager pod's way to Available: pulling both images, the
	// sidecar's startup probe, Kueue's certificate controller writing its Secret and the
	// kubelet updating the mounted copy (syncFrequency), Kueue's webhooks and readiness probe.
	KueueDeployTimeout = 4 * time.Minute
	// SidecarRestartTimeout bounds the kubelet restarting a killed sidecar and its startup
	// probe passing.
	SidecarRestartTimeout = 2 * time.Minute
	// RegistryStartTimeout bounds crane's registry answering on its port.
	RegistryStartTimeout = 30 * time.Second
	// RegistryProbeTimeout bounds one probe of the registry (GET /v2/ on loopback).
	RegistryProbeTimeout = 2 * time.Second
	// ProcessOutputTimeout bounds a started client process printing its first line
	// (kubectl proxy's address).
	ProcessOutputTimeout = 30 * time.Second
	// FakeCallTimeout bounds one call to or from a cloud's stand-in (clouds_test.go): a
	// loopback round trip, or the webhook's call to moto's STS (answers in milliseconds);
	// the broker's own bound on an upstream call is 20 s.
	FakeCallTimeout = 10 * time.Second
	// MotoStartTimeout bounds moto's server answering (a Python import of moto and Flask:
	// seconds; the Rust tests give it 30 s too, tests/src/fakes/sts.rs).
	MotoStartTimeout = 30 * time.Second
	// AuthConfigReloadTimeout bounds kube-apiserver reloading a changed
	// --authentication-config file: it watches the file (fsnotify) and polls it each minute
	// (k8s.io/kubernetes pkg/kubeapiserver/options/authentication.go), so a write is seen at
	// once, a missed event within the minute.
	AuthConfigReloadTimeout = 70 * time.Second
	// DialTimeout bounds one TCP dial on loopback (answered or refused at once).
	DialTimeout = time.Second
	// StopGrace is the time between SIGTERM and SIGKILL for a scenario's Kueue and broker
	// (Kueue's manager stops its controllers and webhooks; the broker finishes its calls).
	StopGrace = 15 * time.Second
	// KueueRestartGrace is StopGrace for the Kueue TestKueueRestart restarts: the test wants a
	// clean stop, not a kill.
	KueueRestartGrace = 30 * time.Second
	// DaemonStopGrace is StopGrace for the fleet's worker Kueues and the node's daemons
	// (kubelet, containerd, the controllers).
	DaemonStopGrace = 10 * time.Second
	// QuickStopGrace is StopGrace for a process that holds nothing worth a clean stop: a
	// broker that failed its health check, a lone broker, kube-proxy, the registry.
	QuickStopGrace = 5 * time.Second
)

// The suite's network namespace and the clean-up after it (netns.go, node.go).
const (
	// netnsPollInterval and netnsWaitRounds: unshare makes the child's namespace in
	// milliseconds; 200 looks 50 ms apart, 10 s at most.
	netnsPollInterval = 50 * time.Millisecond
	netnsWaitRounds   = 200
	// killRoundInterval: between rounds of SIGKILL to what is left in the suite's namespace
	// or the node's cgroups (a process killed needs a moment to leave its cgroup).
	killRoundInterval = 100 * time.Millisecond
)
