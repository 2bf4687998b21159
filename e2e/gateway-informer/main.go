// Command gateway-informer is the recipe for a Go gateway in front of an MCP server: it keeps
// a live cache of its own server's AccessSessions with a stock client-go informer pointed at
// MCP Access's gateway sync listener (port 8085), and needs nothing but
//
//   - the sync URL      (--sync-url,   e.g. https://mcp-access-apiserver.mcp-access.svc:8085),
//   - the listener's CA (--ca-file,    a PEM bundle),
//   - a token file      (--token-file, a projected service-account token bound to the
//     gateway's Pod with audience mcp-runtime-gateway).
//
// No kubeconfig, no RBAC of its own and no database credentials: MCP Access authenticates the
// token (TokenReview), follows the Pod → ReplicaSet → Deployment → MCPServer controller chain
// and serves only the sessions whose spec.server.uid is that MCPServer's. The informer cannot
// ask for more — namespaces, selectors and names outside that scope just come back empty.
//
// The projected token in a real Pod:
//
//	volumes:
//	- name: mcp-access-token
//	  projected:
//	    sources:
//	    - serviceAccountToken: {audience: mcp-runtime-gateway, expirationSeconds: 3600, path: token}
//
// The kubelet rotates that file before the token expires. rest.Config.BearerTokenFile makes
// client-go re-read it (at least every minute, and at once after a 401), so rotation needs no
// code here.
//
// Output, one JSON object per line on stdout (what the end-to-end tests read):
//
//	{"event":"ADD","namespace":"ns","name":"s1","serverUID":"…","phase":"Active","resourceVersion":"…"}
//	{"event":"UPDATE",…}  {"event":"DELETE",…}  {"event":"SYNCED"} once the first list is complete
//
// When the listener refuses the token (401, or 403) the program prints
// {"event":"ERROR","code":401,"reason":"Unauthorized","message":"…"} and exits with status 3:
// the gateway's identity is gone (its Pod, ReplicaSet, Deployment or MCPServer was deleted or
// replaced), so it must stop serving rather than keep a cache it may no longer refresh. Other
// errors (listener restarting, network) are retried by the informer with backoff.
//
// A gateway answers a request for session <namespace>/<name> from the cache alone: allow only
// if the object is present, status.phase is Active and spec.expiresAt is in the future
// (see usable below), evaluated on every request — never cache the decision itself. Deny
// until the informer has synced.
//
// klog flags (e.g. -v=4) are accepted; client-go logs to stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// accessSessions is the only resource the sync listener serves.
var accessSessions = schema.GroupVersionResource{
	Group:    "access.mcp-runtime.dev",
	Version:  "v1alpha1",
	Resource: "accesssessions",
}

// exitAuthFailure is the exit status when the sync listener refuses the token.
const exitAuthFailure = 3

func main() {
	syncURL := flag.String("sync-url", os.Getenv("GATEWAY_SYNC_URL"), "base URL of MCP Access's gateway sync listener (env GATEWAY_SYNC_URL)")
	caFile := flag.String("ca-file", os.Getenv("GATEWAY_SYNC_CA"), "PEM file of the CA that signed the listener's certificate (env GATEWAY_SYNC_CA)")
	tokenFile := flag.String("token-file", os.Getenv("GATEWAY_TOKEN_FILE"), "file holding the Pod-bound token with audience mcp-runtime-gateway; re-read on rotation (env GATEWAY_TOKEN_FILE)")
	namespace := flag.String("namespace", "", "watch one namespace only (default: every namespace the listener grants, i.e. the MCPServer's)")
	klog.InitFlags(nil)
	flag.Parse()
	if *syncURL == "" || *caFile == "" || *tokenFile == "" {
		fmt.Fprintln(os.Stderr, "gateway-informer: --sync-url, --ca-file and --token-file are required")
		os.Exit(2)
	}

	// The whole client configuration: where, which CA, which token file.
	cfg := &rest.Config{
		Host:            *syncURL,
		TLSClientConfig: rest.TLSClientConfig{CAFile: *caFile},
		BearerTokenFile: *tokenFile,
		UserAgent:       "gateway-informer",
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway-informer:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Resync 0: the listener's watch delivers every change; a periodic resync would only
	// replay the cache.
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 0, *namespace, nil)
	informer := factory.ForResource(accessSessions).Informer()

	// The informer retries every failed list or watch forever. A refused token is not
	// transient: report the HTTP status and exit.
	if err := informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if code, reason, refused := authFailure(err); refused {
			emit(map[string]any{"event": "ERROR", "code": code, "reason": reason, "message": err.Error()})
			fmt.Fprintf(os.Stderr, "gateway-informer: the sync listener refused the token: HTTP %d %s\n", code, reason)
			os.Exit(exitAuthFailure)
		}
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		fmt.Fprintln(os.Stderr, "gateway-informer:", err)
		os.Exit(2)
	}

	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { emitSession("ADD", obj) },
		UpdateFunc: func(_, obj any) { emitSession("UPDATE", obj) },
		DeleteFunc: func(obj any) { emitSession("DELETE", obj) },
	}); err != nil {
		fmt.Fprintln(os.Stderr, "gateway-informer:", err)
		os.Exit(2)
	}

	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		fmt.Fprintln(os.Stderr, "gateway-informer: stopped before the first sync")
		os.Exit(1)
	}
	// From here on the gateway may answer from the cache (before it, deny everything).
	emit(map[string]any{"event": "SYNCED"})
	<-ctx.Done()
	factory.Shutdown()
}

// authFailure reports whether err is the listener refusing the token, with its HTTP status.
func authFailure(err error) (code int32, reason string, refused bool) {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return 0, "", false
	}
	code = status.Status().Code
	if code != http.StatusUnauthorized && code != http.StatusForbidden {
		return 0, "", false
	}
	return code, string(status.Status().Reason), true
}

// usable is the gateway's decision for a cached session: Active and not yet expired.
func usable(session *unstructured.Unstructured, now time.Time) bool {
	phase, _, _ := unstructured.NestedString(session.Object, "status", "phase")
	expiresAt, _, _ := unstructured.NestedString(session.Object, "spec", "expiresAt")
	expiry, err := time.Parse(time.RFC3339, expiresAt)
	return phase == "Active" && err == nil && now.Before(expiry)
}

func emitSession(event string, obj any) {
	// A delete missed while the watch was down arrives as a tombstone holding the last state.
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	session, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	serverUID, _, _ := unstructured.NestedString(session.Object, "spec", "server", "uid")
	phase, _, _ := unstructured.NestedString(session.Object, "status", "phase")
	emit(map[string]any{
		"event":           event,
		"namespace":       session.GetNamespace(),
		"name":            session.GetName(),
		"serverUID":       serverUID,
		"phase":           phase,
		"usable":          event != "DELETE" && usable(session, time.Now()),
		"resourceVersion": session.GetResourceVersion(),
	})
}

var stdout = struct {
	sync.Mutex
	enc *json.Encoder
}{enc: json.NewEncoder(os.Stdout)}

// emit writes one JSON line; event handlers and the error handler run on different goroutines.
func emit(line map[string]any) {
	stdout.Lock()
	defer stdout.Unlock()
	_ = stdout.enc.Encode(line)
}
