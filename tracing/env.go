package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// DefaultServiceName is the service.name of a node's spans unless
// OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) says
// otherwise.
const DefaultServiceName = "nornd"

// Resource is what a node says of itself in its spans' resource.
type Resource struct {
	Instance string // service.instance.id: the node id
	Version  string // service.version: the module version
}

// The environment variables FromEnv reads itself. The OTLP exporters also
// read theirs (OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS, _TIMEOUT,
// _COMPRESSION, _CERTIFICATE, _INSECURE and their _TRACES_ forms), the
// batch span processor OTEL_BSP_*, and the resource OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES, from the process environment.
const (
	EnvSDKDisabled        = "OTEL_SDK_DISABLED"
	EnvTracesExporter     = "OTEL_TRACES_EXPORTER"
	EnvProtocol           = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol     = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvEndpoint           = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint     = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvTracesSampler      = "OTEL_TRACES_SAMPLER"
	EnvTracesSamplerArg   = "OTEL_TRACES_SAMPLER_ARG"
	exporterOTLP          = "otlp"
	exporterConsole       = "console"
	exporterNone          = "none"
	protocolGRPC          = "grpc"
	protocolHTTPProtobuf  = "http/protobuf"
	defaultOTLPProtocol   = protocolHTTPProtobuf
	samplerParentRatio    = "parentbased_traceidratio"
	samplerParentAlwaysOn = "parentbased_always_on"
)

// FromEnv returns the tracer provider the environment asks for (getenv
// reads it: os.Getenv), or nil when tracing is off, which is the
// default: unlike the OpenTelemetry SDK's default (otlp), Norn traces
// only when OTEL_TRACES_EXPORTER is otlp or console, or, with it unset,
// when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). OTEL_SDK_DISABLED=true and
// OTEL_TRACES_EXPORTER=none turn it off.
//
// otlp sends over OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL: grpc or http/protobuf (the default);
// console writes the spans as JSON to console. The sampler is
// OTEL_TRACES_SAMPLER with OTEL_TRACES_SAMPLER_ARG (the spec's names;
// default parentbased_always_on). A value it cannot use is an error, so
// that a typo fails at start rather than losing traces silently.
//
// The caller must Shutdown the provider when it stops, to send the spans
// still queued.
func FromEnv(getenv func(string) string, res Resource, console io.Writer) (*sdktrace.TracerProvider, error) {
	if v := strings.TrimSpace(getenv(EnvSDKDisabled)); strings.EqualFold(v, "true") {
		return nil, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv(EnvTracesExporter)))
	if exporter == "" && (getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != "") {
		exporter = exporterOTLP
	}
	if exporter == "" || exporter == exporterNone {
		return nil, nil
	}
	sampler, err := samplerFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	switch exporter {
	case exporterOTLP:
		protocol := strings.TrimSpace(getenv(EnvTracesProtocol))
		if protocol == "" {
			protocol = strings.TrimSpace(getenv(EnvProtocol))
		}
		switch protocol {
		case "", protocolHTTPProtobuf:
			exp, err = otlptracehttp.New(context.Background())
		case protocolGRPC:
			exp, err = otlptracegrpc.New(context.Background())
		default:
			return nil, fmt.Errorf("tracing: %s=%q: want %s or %s", EnvProtocol, protocol, protocolGRPC, protocolHTTPProtobuf)
		}
	case exporterConsole:
		exp, err = stdouttrace.New(stdouttrace.WithWriter(console))
	default:
		return nil, fmt.Errorf("tracing: %s=%q: want %s, %s or %s (one exporter)", EnvTracesExporter, exporter, exporterOTLP, exporterConsole, exporterNone)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: %s exporter: %w", exporter, err)
	}
	r, err := newResource(res)
	if err != nil {
		return nil, errors.Join(err, exp.Shutdown(context.Background()))
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp), // OTEL_BSP_* tune it
		sdktrace.WithResource(r),
		sdktrace.WithSampler(sampler),
	), nil
}

// newResource is the node's resource: service.name nornd, its instance and
// version, then what OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES say
// (they win).
func newResource(res Resource) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{attribute.String("service.name", DefaultServiceName)}
	if res.Instance != "" {
		attrs = append(attrs, attribute.String("service.instance.id", res.Instance))
	}
	if res.Version != "" {
		attrs = append(attrs, attribute.String("service.version", res.Version))
	}
	r, err := resource.New(context.Background(),
		resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return r, nil
}

// samplerFromEnv is the sampler of OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG (a ratio in [0, 1] for the ratio samplers,
// default 1).
func samplerFromEnv(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.ToLower(strings.TrimSpace(getenv(EnvTracesSampler)))
	arg := strings.TrimSpace(getenv(EnvTracesSamplerArg))
	ratio := 1.0
	if arg != "" && (name == "traceidratio" || name == samplerParentRatio) {
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil || v < 0 || v > 1 {
			return nil, fmt.Errorf("tracing: %s=%q: want a ratio from 0 to 1", EnvTracesSamplerArg, arg)
		}
		ratio = v
	}
	switch name {
	case "", samplerParentAlwaysOn:
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case samplerParentRatio:
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	}
	return nil, fmt.Errorf("tracing: %s=%q: want always_on, always_off, traceidratio, %s, parentbased_always_off or %s",
		EnvTracesSampler, name, samplerParentAlwaysOn, samplerParentRatio)
}
